"""What each host of a group contributes to boot learning and the compile cache. Pure.

Boot learning in a group: vLLM's Ray workers log on the leader (Ray forwards every worker's
output to the driver), so the leader's boot log holds each rank's `--kv-cache-memory=` suggestion
and the reader keeps the smallest: one value for the whole group, which vLLM applies to every
rank. It is learned under a fingerprint of every host's assigned GPUs (leader first, then the
followers in `hosts` order) and reused only when every one of those GPUs, on every host, has at
least 99 % of the free memory it had when the value was learned (followers report theirs in
`GET /v1/status`).

The compile cache: each host keeps its own cache dir (`cache_dir/deployments/NAME/vllm`) and its
Ray node starts with VLLM_CACHE_ROOT pointing there, so the workers vLLM places on that host read
and write that host's cache. vLLM copies the driver's VLLM_* variables into every Ray worker
(vllm/ray/ray_env.py get_env_vars_to_copy) unless `$VLLM_CONFIG_ROOT/ray_non_carry_over_env_vars
.json` lists them: dankserve writes that file listing VLLM_CACHE_ROOT, so the leader's path does
not replace each host's own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dankserve.host.model import GpuIdentity, Host
from dankserve.plan import checks

NON_CARRY_OVER_FILE = "ray_non_carry_over_env_vars.json"
HOST_LOCAL_VARIABLES = ("VLLM_CACHE_ROOT",)
"""vLLM variables each host sets for its own Ray workers; the driver must not overwrite them."""


@dataclass(frozen=True)
class MemberGpu:
    """One GPU a follower gives the group: what identifies it for learning, and its free memory now."""

    identity: GpuIdentity
    free_bytes: int


def follower_gpus(
    answer: Mapping[str, Any], gpus: Sequence[int | str] | None, deployment: str
) -> tuple[MemberGpu, ...]:
    """A follower's assigned GPUs (as the planner assigns them) from its status answer.

    `gpu_memory` maps UUID to free bytes now; a GPU it does not list (an older follower, or NVML
    unreadable) counts as none free, so the learned bytes are not reused on a guess.
    """
    host = Host.model_validate(answer["host"])
    readings = answer.get("gpu_memory") or {}
    out = []
    for gpu in checks.resolve_gpus(host, gpus, deployment):
        free = readings.get(gpu.uuid)
        out.append(MemberGpu(GpuIdentity(gpu.name, gpu.memory_total_bytes), free if isinstance(free, int) else 0))
    return tuple(out)


def free_memory_report(readings: Mapping[str, int | None]) -> dict[str, int]:
    """What a follower reports as `gpu_memory`: free bytes by UUID, unknown readings left out."""
    return {uuid: free for uuid, free in readings.items() if free is not None}


def non_carry_over(existing: Sequence[str] = ()) -> str:
    """The content of vLLM's non-carry-over file: what was there plus the host-local variables."""
    return json.dumps(sorted({*existing, *HOST_LOCAL_VARIABLES}))


def node_env(cache_root: str) -> dict[str, str]:
    """The environment of a Ray node (head or worker): this host's compile cache for its workers."""
    return {"VLLM_CACHE_ROOT": cache_root}
