"""Leader mode: with `--distributed-executor-backend ray`, join the Ray cluster and reserve a
placement group of TP x PP one-GPU bundles, as vLLM's initialize_ray_cluster does
(vllm/v1/executor/ray_utils.py), failing with its message when the cluster has too few GPUs.
Then one task per bundle plays vLLM's RayWorkerWrapper for the compile cache: it takes the
VLLM_* variables the driver copies into every worker (vllm/ray/ray_env.py, minus those listed in
`$VLLM_CONFIG_ROOT/ray_non_carry_over_env_vars.json`), looks for its rank's AOT artifact under
the resulting VLLM_CACHE_ROOT on its own node, writes it on a miss, and appends `rank R hit|miss`
to `VLLM_CACHE_ROOT/stand-in-ray-workers.log` there.

Only when `ray` is importable; the stand-in's image has no Ray, and then this is skipped.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

DEFAULT_PG_WAIT_SECONDS = 60  # vLLM's PG_WAIT_TIMEOUT (ray_utils.py)
NON_CARRY_OVER_FILE = "ray_non_carry_over_env_vars.json"
WORKER_SPECIFIC = frozenset({"VLLM_HOST_IP", "VLLM_HOST_PORT", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES"})
WORKERS_LOG = "stand-in-ray-workers.log"


def non_carry_over(env: Mapping[str, str]) -> frozenset[str]:
    """The variables vLLM will not copy into Ray workers (its config file; absent or unreadable: none)."""
    root = env.get("VLLM_CONFIG_ROOT") or os.path.join(os.path.expanduser("~"), ".config", "vllm")
    try:
        with open(os.path.join(root, NON_CARRY_OVER_FILE), encoding="utf-8") as f:
            return frozenset(str(name) for name in json.load(f))
    except (OSError, ValueError, TypeError):
        return frozenset()


def carried_env(env: Mapping[str, str]) -> dict[str, str]:
    """What vLLM's Ray executor copies from the driver into every worker's environment."""
    skipped = non_carry_over(env) | WORKER_SPECIFIC
    return {name: value for name, value in env.items() if name.startswith("VLLM_") and name not in skipped}


def _compile_on_worker(rank: int, copied: dict[str, str], backend_hash: str, aot_hash: str) -> dict[str, Any]:
    """Runs in a Ray worker process on the bundle's node (pickled by value: stdlib only)."""
    env = {**os.environ, **copied}
    root = env.get("VLLM_CACHE_ROOT") or os.path.join(os.path.expanduser("~"), ".cache", "vllm")
    model = os.path.join(root, "torch_compile_cache", "torch_aot_compile", aot_hash, f"rank_{rank}_0", "model")
    hit = os.path.isfile(model)
    if not hit:
        os.makedirs(os.path.dirname(model), exist_ok=True)
        with open(model, "w", encoding="utf-8") as f:
            f.write(f"stand-in AOT compiled model {aot_hash} rank {rank}\n")
    with open(os.path.join(root, "stand-in-ray-workers.log"), "a", encoding="utf-8") as f:
        f.write(f"rank {rank} {'hit' if hit else 'miss'}\n")
    backbone = os.path.join(root, "torch_compile_cache", backend_hash, f"rank_{rank}_0", "backbone")
    return {"rank": rank, "pid": os.getpid(), "host": socket.gethostname(), "dir": backbone, "hit": hit}


def _node_ip() -> str:
    """The node a Ray task runs on (pickled by value with the module)."""
    return str(importlib.import_module("ray").util.get_node_ip_address())


def rank_order(bundle_ips: Sequence[str], driver_ip: str) -> list[int]:
    """Bundle indices in vLLM's rank order: the driver's node first, then by node IP (ray_executor.py's
    sort_by_driver_then_worker_ip), so a rank stays on the same host from boot to boot."""
    return sorted(range(len(bundle_ips)), key=lambda i: (bundle_ips[i] != driver_ip, bundle_ips[i], i))


def run_workers(group: Any, world_size: int, env: Mapping[str, str], backend_hash: str, aot_hash: str) -> None:
    """One worker per bundle on its node, as vLLM places its RayWorkerWrappers; their cache lines printed."""
    ray: Any = importlib.import_module("ray")
    strategy: Any = importlib.import_module("ray.util.scheduling_strategies").PlacementGroupSchedulingStrategy
    copied = carried_env(env)
    # The workers cannot import the stand-in: send this module's code along, as cloudpickle can.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    on_bundle = [strategy(placement_group=group, placement_group_bundle_index=i) for i in range(world_size)]
    where = ray.remote(num_gpus=1, num_cpus=0)(_node_ip)
    ips = ray.get([where.options(scheduling_strategy=s).remote() for s in on_bundle], timeout=120)
    order = rank_order(ips, env.get("VLLM_HOST_IP") or ray.util.get_node_ip_address())
    remote = ray.remote(num_gpus=1, num_cpus=0)(_compile_on_worker)
    refs = [
        remote.options(scheduling_strategy=on_bundle[bundle]).remote(rank, copied, backend_hash, aot_hash)
        for rank, bundle in enumerate(order)
    ]
    for result in ray.get(refs, timeout=120):
        print(
            f"(RayWorkerWrapper pid={result['pid']}) INFO [backends.py:1126] Using cache directory: "
            f"{result['dir']} for vLLM's torch.compile ({'hit' if result['hit'] else 'miss'})",
            flush=True,
        )


def join_ray_cluster(world_size: int, env: Mapping[str, str]) -> tuple[int | None, Any]:
    """(None, placement group) once reserved; (exit code, None) on failure, as vLLM exits."""
    try:  # through importlib: typed the same whether or not Ray is installed
        ray: Any = importlib.import_module("ray")
        placement_group: Any = importlib.import_module("ray.util.placement_group").placement_group
    except ImportError:
        print("WARNING Failed to import Ray: the stand-in runs without it (pip install ray)", file=sys.stderr)
        return None, None
    timeout = float(env.get("FAKE_VLLM_PG_WAIT_SECONDS", DEFAULT_PG_WAIT_SECONDS))
    address = env.get("RAY_ADDRESS") or "auto"
    ray.init(address=address, ignore_reinit_error=True, logging_level=logging.ERROR, log_to_driver=False)
    available = ray.cluster_resources().get("GPU", 0)
    print(f"INFO Current cluster resources: {ray.cluster_resources()}", flush=True)
    if world_size > available:
        print(
            "WARNING The number of required GPUs exceeds the total number of available GPUs in the placement group.",
            flush=True,
        )
    specs: list[dict[str, float]] = [{"GPU": 1.0} for _ in range(world_size)]
    group = placement_group(specs, strategy="PACK")
    started = time.time()
    ready = group.ready()
    done, _ = ray.wait([ready], timeout=timeout)
    if not done:
        print(
            "ValueError: Cannot provide a placement group of "
            f"placement_group_specs={specs} within {int(timeout)} seconds. See "
            "`ray status` to make sure the cluster has enough resources.",
            file=sys.stderr,
            flush=True,
        )
        return 1, None
    print(
        f"INFO Placement group of {world_size} GPU bundles ready after {time.time() - started:.1f}s "
        f"on {len({n['NodeID'] for n in ray.nodes() if n.get('Alive')})} nodes (pid {os.getpid()})",
        flush=True,
    )
    return None, group
