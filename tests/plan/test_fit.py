"""Tests for the planner's fit: the utilisation band chosen by fit, idle GPUs, capacity, host RAM,
extra_args replacing planned flags, and the model family's parsers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dankserve.errors import ConfigError, InfeasiblePlan
from dankserve.plan.checks import check_host_ram
from dankserve.plan.models import ModelFacts
from dankserve.plan.plan import plan_deployment
from dankserve.plan.types import Plan
from dankserve.settings import DeploymentSettings
from tests.plan.builders import GIB, caps, gpu, host, recorded

QWEN3_8B = ModelFacts(
    model="Qwen/Qwen3-8B",
    parameter_bytes=16_381_470_720,
    num_attention_heads=32,
    num_key_value_heads=8,
    num_hidden_layers=36,
    head_dim=128,
    max_position_embeddings=40960,
    dtype_bytes=2,
    model_type="qwen3",
)
SMALL = replace(QWEN3_8B, parameter_bytes=1 * GIB)
RTX4090 = recorded("rtx4090x1-1numa")


def reason(plan: Plan, flag: str) -> str:
    return next(f.reason for f in plan.flags if f.flag == flag)


def test_qwen3_8b_at_8192_fits_one_4090_inside_the_band() -> None:
    """The issue's case: 0.70 is too little, so the lowest point that holds it (0.75), not a refusal."""
    plan = plan_deployment(
        "d", DeploymentSettings(model="Qwen/Qwen3-8B", max_model_len=8192), RTX4090, caps(), QWEN3_8B
    )
    assert plan.gpu_memory_utilization == 0.75
    why = reason(plan, "--gpu-memory-utilization")
    assert "recommended for 24 GB cards" in why and "0.70-0.80" in why and "lowest point that holds" in why
    assert "seed" not in why


def test_small_model_keeps_the_band_bottom() -> None:
    """What fits at the band's lowest point gets it, and the reason says so."""
    small = replace(QWEN3_8B, parameter_bytes=2 * GIB, max_position_embeddings=8192)
    plan = plan_deployment("d", DeploymentSettings(model="m"), RTX4090, caps(), small)
    assert plan.gpu_memory_utilization == 0.70
    assert "lowest point already holds" in reason(plan, "--gpu-memory-utilization")


def test_native_context_not_fitting_takes_the_top_and_auto() -> None:
    """Unset max_model_len whose native context fits nowhere in the band: the top, and auto shrinks it."""
    plan = plan_deployment("d", DeploymentSettings(model="Qwen/Qwen3-8B"), RTX4090, caps(), QWEN3_8B)
    assert plan.gpu_memory_utilization == 0.80 and plan.max_model_len == "auto"
    assert "its top" in reason(plan, "--gpu-memory-utilization")
    assert plan.capacity is not None and plan.capacity.context_tokens is not None
    assert plan.capacity.context_tokens < 40960 and "shrunk" in plan.capacity.context_note


def test_beyond_the_band_refuses_with_the_numbers() -> None:
    """A context that does not fit even at the band's top: exit 4 with needed vs left and the fixes."""
    with pytest.raises(InfeasiblePlan) as error:
        plan_deployment("d", DeploymentSettings(model="q", max_model_len=40960), RTX4090, caps(), QWEN3_8B)
    assert "GiB" in error.value.message and error.value.fix is not None
    assert "gpu_memory_utilization" in error.value.fix


def test_set_utilisation_is_kept() -> None:
    """gpu_memory_utilization set by hand is never moved."""
    dep = DeploymentSettings(model="q", max_model_len=4096, gpu_memory_utilization=0.9)
    plan = plan_deployment("d", dep, RTX4090, caps(), QWEN3_8B)
    assert plan.gpu_memory_utilization == 0.9 and reason(plan, "--gpu-memory-utilization").startswith("set in config")


def test_idle_gpus_are_named() -> None:
    """TP 1 on two assigned GPUs: the warning names the idle one and what to do."""
    plan = plan_deployment(
        "d", DeploymentSettings(model="q", max_model_len=8192), host(gpus=(gpu(0), gpu(1))), caps(), QWEN3_8B
    )
    assert plan.tensor_parallel_size == 1
    assert any("GPU 1 stays idle" in w for w in plan.warnings)


def test_capacity_in_the_users_terms() -> None:
    """Context length and full-length concurrency from the KV cache left beside the weights."""
    plan = plan_deployment("d", DeploymentSettings(model="q", max_model_len=8192), RTX4090, caps(), QWEN3_8B)
    cap = plan.capacity
    assert cap is not None and cap.context_tokens == 8192
    assert cap.kv_cache_tokens is not None and cap.concurrency == pytest.approx(cap.kv_cache_tokens / 8192)
    assert cap.concurrency is not None and cap.concurrency >= 1 and "requests of full length at once" in cap.describe()
    assert plan.to_json()["capacity"]["context_tokens"] == 8192


def test_extra_args_replace_the_planned_flag_and_the_checks_use_them() -> None:
    """--max-num-seqs and --max-model-len from extra_args replace the planned ones (once in argv), and the fit
    check uses them: a context too long for the GPU is refused as if it were configured."""
    dep = DeploymentSettings(model="q", max_model_len=8192, extra_args=["--max-num-seqs", "7", "--max-model-len=4096"])
    plan = plan_deployment("d", dep, RTX4090, caps(), QWEN3_8B)
    assert plan.argv.count("--max-num-seqs") == 1 and plan.argv[plan.argv.index("--max-num-seqs") + 1] == "7"
    assert plan.argv.count("--max-model-len") == 1 and plan.argv[plan.argv.index("--max-model-len") + 1] == "4096"
    assert reason(plan, "--max-num-seqs").startswith("set in extra_args")
    with pytest.raises(InfeasiblePlan, match="max_model_len 40960"):
        plan_deployment(
            "d", dep.model_copy(update={"extra_args": ["--max-model-len", "40960"]}), RTX4090, caps(), QWEN3_8B
        )


def test_extra_args_other_planned_flag_gives_way() -> None:
    """A planned flag without a setting (--kv-offloading-backend) set in extra_args: only the user's is passed."""
    dep = DeploymentSettings(model="q", max_model_len=8192, extra_args=["--kv-offloading-backend", "lmcache"])
    plan = plan_deployment("d", dep, RTX4090, caps(), QWEN3_8B)
    assert plan.argv.count("--kv-offloading-backend") == 1
    assert plan.argv[plan.argv.index("--kv-offloading-backend") + 1] == "lmcache"


def test_extra_args_bad_value_is_exit_2() -> None:
    """A value the setting would refuse is refused in extra_args too, naming it."""
    dep = DeploymentSettings(model="q", extra_args=["--gpu-memory-utilization", "1.5"])
    with pytest.raises(ConfigError, match="extra_args"):
        plan_deployment("d", dep, RTX4090, caps(), QWEN3_8B)


def test_qwen3_gets_its_parsers_each_switchable_off() -> None:
    """Qwen3: --reasoning-parser qwen3 and hermes tool calls; "off" drops each."""
    plan = plan_deployment("d", DeploymentSettings(model="q", max_model_len=8192), RTX4090, caps(), QWEN3_8B)
    assert tuple(plan.argv[plan.argv.index("--reasoning-parser") :][:2]) == ("--reasoning-parser", "qwen3")
    assert "--enable-auto-tool-choice" in plan.argv and "hermes" in plan.argv
    off = DeploymentSettings(model="q", max_model_len=8192, reasoning_parser="off", tool_call_parser="off")
    plain = plan_deployment("d", off, RTX4090, caps(), QWEN3_8B)
    assert "--reasoning-parser" not in plain.argv and "--tool-call-parser" not in plain.argv


def test_parsers_only_where_the_release_has_them() -> None:
    """A release without --reasoning-parser gets no such flag, with a warning; a configured one is refused (exit 4)."""
    old = caps("0.10.0")
    plan = plan_deployment("d", DeploymentSettings(model="q", max_model_len=8192), RTX4090, old, QWEN3_8B)
    has = old.has("--reasoning-parser")
    assert ("--reasoning-parser" in plan.argv) is has
    assert has or any("--reasoning-parser" in w for w in plan.warnings)


def test_host_ram_of_all_deployments_together() -> None:
    """Four deployments taking 16 GiB of CPU KV offload each on a 62 GiB host: exit 4 naming the sum."""
    plans = [
        plan_deployment(
            name, DeploymentSettings(model="q", max_model_len=4096, gpu_memory_utilization=0.2), RTX4090, caps(), SMALL
        )
        for name in "abcd"
    ]
    assert all(p.host_ram_bytes == 16 * GIB for p in plans)
    check_host_ram(plans[:2], RTX4090)
    with pytest.raises(InfeasiblePlan) as error:
        check_host_ram(plans, RTX4090)
    assert "64.0 GiB" in error.value.message and "kv_offload" in (error.value.fix or "")
