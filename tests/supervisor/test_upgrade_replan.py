"""The upgrade's re-plan names what the new release changes (issue 42): `judging.plan_changes` on real plans."""

from __future__ import annotations

from dankserve.plan.catalogue import load_catalogue
from dankserve.plan.plan import plan_deployment
from dankserve.plan.releases import GatewayQueue
from dankserve.plan.types import Plan
from dankserve.settings import DeploymentSettings
from dankserve.supervisor.upgrade import plan_changes
from tests.plan.builders import GIB, QWEN3_30B, caps, host


def plan(version: str, learned: int | None, **settings: object) -> Plan:
    return plan_deployment(
        "d",
        DeploymentSettings.model_validate({"model": "q", **settings}),
        host(),
        caps(version),
        QWEN3_30B,
        learned_kv_cache_memory_bytes=learned,
        catalogue=load_catalogue(),
        gateway=GatewayQueue(None, 64),
    )


def test_0_33_to_0_34_names_the_release_the_kv_sizing_and_the_kept_kernels() -> None:
    """A warm 0.33 server (learned KV bytes) re-planned for 0.34 (learned bytes are per release: a first boot)."""
    changes = plan_changes(plan("0.33.0", 40 * GIB), plan("0.34.0", None))
    assert changes[0] == "vLLM 0.33.0 -> 0.34.0"
    assert "dropped --kv-cache-memory-bytes" in changes
    assert "kept kernels /root/.cache/vllm/kernels/0.33.0 -> /root/.cache/vllm/kernels/0.34.0" in changes
    assert any(c.startswith("note: KV cache: vLLM 0.34.0 sizes it itself") for c in changes)
    assert any(c.startswith("note: first boot: `vllm download-kernels`") for c in changes)
    assert not any("--max-num-queued-reqs" in c for c in changes)  # the same limit on both


def test_0_26_to_0_34_adds_vllms_admission() -> None:
    changes = plan_changes(plan("0.26.0", None), plan("0.34.0", None))
    assert any(c.startswith("added --max-num-queued-reqs") and "gateway" in c for c in changes)
    assert any(c.startswith("kept kernels none -> ") for c in changes)


def test_the_same_plan_changes_nothing_and_no_old_plan_says_nothing() -> None:
    assert plan_changes(plan("0.34.0", GIB), plan("0.34.0", GIB)) == ()
    assert plan_changes(None, plan("0.34.0", GIB)) == ()


def test_a_changed_value_and_env_are_named() -> None:
    changes = plan_changes(plan("0.34.0", GIB, max_num_seqs=8), plan("0.34.0", GIB, max_num_seqs=16, env={"X": "1"}))
    assert "--max-num-seqs 8 -> 16" in changes and "env X=1" in changes
