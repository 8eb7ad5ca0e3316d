"""What each host of a group contributes to boot learning and the compile cache (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dankserve.cluster.per_host import (
    HOST_LOCAL_VARIABLES,
    MemberGpu,
    follower_gpus,
    free_memory_report,
    node_env,
    non_carry_over,
)
from dankserve.host.model import GpuIdentity
from dankserve.state import LearnedKv
from dankserve.supervisor.learning import MemoryFlags, boot_fingerprint, decide_kv_reuse
from tests.plan.builders import GIB, gpu, host

H100 = "NVIDIA H100 80GB HBM3"


def status_answer(free: dict[str, int] | None, gpu_count: int = 2, name: str = H100) -> dict[str, Any]:
    """A follower's GET /v1/status answer with `gpu_count` GPUs and the given free readings."""
    answer: dict[str, Any] = {
        "ok": True,
        "host": host(gpus=tuple(gpu(i, name=name) for i in range(gpu_count))).model_dump(mode="json"),
        "workers": {},
    }
    if free is not None:
        answer["gpu_memory"] = free
    return answer


@pytest.mark.parametrize(
    ("free", "gpus", "expected_free"),
    [
        ({"GPU-test-0": 70 * GIB, "GPU-test-1": 71 * GIB}, None, [70 * GIB, 71 * GIB]),
        ({"GPU-test-0": 70 * GIB, "GPU-test-1": 71 * GIB}, [1], [71 * GIB]),
        ({"GPU-test-0": 70 * GIB, "GPU-test-1": 71 * GIB}, ["GPU-test-0"], [70 * GIB]),
        ({"GPU-test-0": 70 * GIB}, None, [70 * GIB, 0]),  # GPU 1 unreadable: counts as none free
        (None, None, [0, 0]),  # an older follower that reports no free memory
    ],
)
def test_follower_gpus(free: dict[str, int] | None, gpus: list[int | str] | None, expected_free: list[int]) -> None:
    """A follower's assigned GPUs come from its status answer in the planner's order, unknown free memory as 0."""
    found = follower_gpus(status_answer(free), gpus, "big")
    assert [g.free_bytes for g in found] == expected_free
    assert all(g.identity == GpuIdentity(H100, 80 * GIB) for g in found)


def test_free_memory_report_leaves_out_unknown_readings() -> None:
    """A follower reports free bytes by UUID and leaves out GPUs whose reading is unknown."""
    assert free_memory_report({"a": 5, "b": None, "c": 0}) == {"a": 5, "c": 0}


@pytest.mark.parametrize(
    ("existing", "expected"),
    [
        ((), ["VLLM_CACHE_ROOT"]),
        (("VLLM_X",), ["VLLM_CACHE_ROOT", "VLLM_X"]),
        (HOST_LOCAL_VARIABLES, ["VLLM_CACHE_ROOT"]),
    ],
)
def test_non_carry_over(existing: tuple[str, ...], expected: list[str]) -> None:
    """vLLM's non-carry-over list always holds VLLM_CACHE_ROOT, once, beside what was there."""
    assert json.loads(non_carry_over(existing)) == expected


def test_node_env_points_workers_at_this_hosts_cache() -> None:
    """A Ray node starts with VLLM_CACHE_ROOT set to its own host's compile cache dir."""
    assert node_env("/var/cache/dankserve/deployments/big/vllm") == {
        "VLLM_CACHE_ROOT": "/var/cache/dankserve/deployments/big/vllm"
    }


def group_key(follower_gpu_name: str) -> str:
    leader = [GpuIdentity(H100, 80 * GIB)] * 2
    follower = [g.identity for g in follower_gpus(status_answer(None, name=follower_gpu_name), None, "big")]
    return boot_fingerprint(vllm="0.33.0", model="m", revision=None, gpus=leader + follower, flags=MemoryFlags())


def test_group_fingerprint_includes_every_hosts_gpus() -> None:
    """The learned bytes of a group are keyed by every host's GPUs: another GPU on a follower is another key."""
    assert group_key(H100) == group_key(H100)
    assert group_key(H100) != group_key("NVIDIA H200")


LEARNED = LearnedKv(20 * GIB, (70 * GIB,) * 4, 0.0)


@pytest.mark.parametrize(
    ("leader_free", "followers", "reused"),
    [
        ([70 * GIB] * 2, [MemberGpu(GpuIdentity(H100, 80 * GIB), 70 * GIB)] * 2, True),
        ([70 * GIB] * 2, [MemberGpu(GpuIdentity(H100, 80 * GIB), 69 * GIB)] * 2, False),  # a follower's GPU short
        ([69 * GIB, 70 * GIB], [MemberGpu(GpuIdentity(H100, 80 * GIB), 70 * GIB)] * 2, False),  # the leader's short
        ([70 * GIB] * 2, [], False),  # a follower did not answer: fewer GPUs than learned
    ],
)
def test_group_guard(leader_free: list[int], followers: list[MemberGpu], reused: bool) -> None:
    """Learned bytes are reused only when every GPU of every host has >= 99 % of its learned free memory."""
    decision = decide_kv_reuse(LEARNED, leader_free + [g.free_bytes for g in followers])
    assert (decision.use_bytes is not None) is reused
