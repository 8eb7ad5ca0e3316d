"""Leader mode: with `--distributed-executor-backend ray`, join the Ray cluster and reserve a
placement group of TP x PP one-GPU bundles, as vLLM's initialize_ray_cluster does
(vllm/v1/executor/ray_utils.py), failing with its message when the cluster has too few GPUs.

Only when `ray` is importable; the stand-in's image has no Ray, and then this is skipped.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

DEFAULT_PG_WAIT_SECONDS = 60  # vLLM's PG_WAIT_TIMEOUT (ray_utils.py)


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
