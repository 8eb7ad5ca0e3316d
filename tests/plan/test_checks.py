"""Tests for dankserve.plan.checks: each check, its exit code and what its message names."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dankserve.errors import ConfigError, InfeasiblePlan, UnknownValueError
from dankserve.exitcodes import ExitCode
from dankserve.plan import checks, rules
from dankserve.plan.catalogue import load_catalogue
from dankserve.plan.types import Plan
from tests.plan.builders import GIB, LLAMA_70B, QWEN3_30B, caps, gpu, host


@pytest.mark.parametrize(
    ("version", "value", "suggested"),
    [
        ("0.33.0", "q8_0", ("fp8", "int8_per_token_head")),
        ("0.10.0", "q8_0", ("fp8",)),
        ("0.33.0", "bf16", ("bfloat16",)),
        ("0.33.0", "fp8_e4m4", ("fp8_e4m3",)),
    ],
)
def test_unknown_kv_cache_dtype_is_invalid_input(version: str, value: str, suggested: tuple[str, ...]) -> None:
    """An unknown KV dtype exits 2, lists the valid ones and suggests the closest (q8_0: fp8, int8_per_token_head)."""
    with pytest.raises(UnknownValueError) as info:
        checks.check_kv_cache_dtype(value, caps(version))
    assert info.value.exit_code == ExitCode.INVALID_INPUT
    message = info.value.message
    assert repr(value) in message
    assert "closest: " + " or ".join(suggested) in message
    assert all(d in message for d in caps(version).kv_cache_dtypes)


def test_known_kv_cache_dtype_passes() -> None:
    """A dtype the release knows passes."""
    checks.check_kv_cache_dtype("int8_per_token_head", caps("0.33.0"))


def test_kv_cache_dtype_of_a_newer_release_is_infeasible() -> None:
    """A dtype only newer releases have exits 4, naming the first release that has it."""
    with pytest.raises(InfeasiblePlan, match=r"appears in 0\.\d+\.\d+") as info:
        checks.check_kv_cache_dtype("int8_per_token_head", caps("0.10.0"), load_catalogue())
    assert info.value.exit_code == ExitCode.INFEASIBLE


def test_unknown_attention_backend_is_invalid_input() -> None:
    """An attention backend the release does not name exits 2; a known one passes in any case."""
    checks.check_attention_backend("flashinfer", caps())
    with pytest.raises(UnknownValueError) as info:
        checks.check_attention_backend("FLASH_ATTENTION_3", caps())
    assert "FLASH_ATTN" in info.value.message


def test_speculative_method_newer_release_is_infeasible_unknown_is_invalid() -> None:
    """A method only newer releases have exits 4 naming that release; a method none has exits 2."""
    with pytest.raises(InfeasiblePlan, match=r"appears in 0\.20\.0"):
        checks.check_speculative_method("dflash", caps("0.19.1"), load_catalogue())
    with pytest.raises(UnknownValueError, match="bogus"):
        checks.check_speculative_method("bogus", caps(), load_catalogue())
    checks.check_speculative_method("dflash", caps(), load_catalogue())


@pytest.mark.parametrize(("cores", "gpus", "ok"), [(3, 1, True), (2, 1, False), (6, 4, True), (5, 4, False)])
def test_cores_below_two_plus_gpus_is_infeasible(cores: int, gpus: int, ok: bool) -> None:
    """Physical cores below 2 + GPUs exit 4 (API server, engine core, one worker per GPU)."""
    if ok:
        checks.check_cores(host(cores=cores), gpus)
        return
    with pytest.raises(InfeasiblePlan) as info:
        checks.check_cores(host(cores=cores), gpus)
    assert info.value.exit_code == ExitCode.INFEASIBLE
    assert f"at least {2 + gpus}" in info.value.message


def test_tp_beyond_gpus_or_not_dividing_heads_is_infeasible() -> None:
    """TP larger than the GPUs, or not dividing the heads, exits 4 with the valid sizes."""
    checks.check_tensor_parallel(4, 4, LLAMA_70B)
    with pytest.raises(InfeasiblePlan, match="exceeds the 2 GPU"):
        checks.check_tensor_parallel(4, 2, LLAMA_70B)
    with pytest.raises(InfeasiblePlan) as info:
        checks.check_tensor_parallel(3, 4, LLAMA_70B)
    assert "must be divisible by tensor parallel size (3)" in info.value.message
    assert "1, 2, 4" in (info.value.fix or "")


def test_weights_that_do_not_fit_are_infeasible_with_numbers() -> None:
    """Weights plus reserve above the per-GPU budget exit 4, naming weights, share, reserve and budget."""
    fit = rules.gpu_fit(1, int(0.9 * 80 * GIB), LLAMA_70B.parameter_bytes or 0)
    with pytest.raises(InfeasiblePlan) as info:
        checks.check_weights_fit(fit, LLAMA_70B, 1, 0.9)
    message = info.value.message
    assert "131.4 GiB of weights over 1 GPU(s)" in message and "2.0 GiB runtime reserve" in message
    assert "72.0 GiB budget" in message
    checks.check_weights_fit(rules.gpu_fit(2, int(0.9 * 80 * GIB), LLAMA_70B.parameter_bytes or 0), LLAMA_70B, 2, 0.9)


def test_context_whose_kv_cannot_fit_is_infeasible() -> None:
    """A max_model_len whose KV cache exceeds what is left exits 4, quoting vLLM's error and the largest fit."""
    per_token = LLAMA_70B.kv_bytes_per_token(2, 2) or 0
    with pytest.raises(InfeasiblePlan) as info:
        checks.check_max_model_len(131072, 4 * GIB, per_token, caps())
    assert "To serve at least one request with the model's max seq len (131072)" in info.value.message
    largest = rules.largest_context(4 * GIB, per_token)
    assert f'set max_model_len to {largest} or less or max_model_len = "auto"' in (info.value.fix or "")
    checks.check_max_model_len(8192, 4 * GIB, per_token, caps())


def test_auto_length_on_an_old_release_is_infeasible() -> None:
    """max_model_len = auto on a release before 0.14 exits 4 naming the first release that takes it."""
    with pytest.raises(InfeasiblePlan, match=r"from 0\.14\.0"):
        checks.check_max_model_len_auto(caps("0.13.0"), load_catalogue())
    checks.check_max_model_len_auto(caps("0.14.0"), load_catalogue())


def test_flags_the_release_lacks_are_infeasible() -> None:
    """Flags the target release lacks exit 4, naming the setting and the releases that have the flag."""
    with pytest.raises(InfeasiblePlan) as info:
        checks.check_flags_supported(
            [("--numa-bind", "numa_bind = true"), ("--swap-space", "kv_offload"), ("--port", "port")],
            caps("0.33.0"),
            load_catalogue(),
        )
    assert "--swap-space for kv_offload (vLLM 0.10.0 to 0.17.1 have it)" in info.value.message
    assert "--numa-bind" not in info.value.message
    with pytest.raises(InfeasiblePlan, match=r"--numa-bind for numa_bind = true \(added in 0\.20\.0\)"):
        checks.check_flags_supported([("--numa-bind", "numa_bind = true")], caps("0.19.0"), load_catalogue())


def test_gpus_the_host_lacks_are_invalid_input() -> None:
    """gpus naming a GPU the host lacks exits 2; indices and UUIDs resolve in PCI order."""
    the_host = host(gpus=(gpu(0), gpu(1)))
    assert [g.index for g in checks.resolve_gpus(the_host, [1, "GPU-test-0"], "chat")] == [0, 1]
    assert len(checks.resolve_gpus(the_host, None, "chat")) == 2
    with pytest.raises(ConfigError) as info:
        checks.resolve_gpus(the_host, [2], "chat")
    assert info.value.exit_code == ExitCode.INVALID_INPUT
    assert "deployments.chat.gpus names GPU 2" in info.value.message


def test_no_gpu_is_infeasible() -> None:
    """A host without GPUs cannot run a deployment: exit 4."""
    with pytest.raises(InfeasiblePlan, match="no GPU"):
        checks.check_has_gpus((), "chat")


def _plan(name: str, gpus: tuple[int, ...], utilisation: float) -> Plan:
    return Plan(
        deployment=name, image="i", model="m", vllm_version="0.33.0", argv=("m",), env={}, flags=(), warnings=(),
        gpu_indices=gpus, gpu_uuids=(), tensor_parallel_size=len(gpus), numa_bind=False, fingerprint="f",
        gpu_memory_utilization=utilisation,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("plans", "ok"),
    [
        ([_plan("a", (0,), 0.45), _plan("b", (0,), 0.45)], True),
        ([_plan("a", (0,), 0.90), _plan("b", (1,), 0.90)], True),
        ([_plan("a", (0,), 0.50), _plan("b", (0,), 0.45)], True),
        ([_plan("a", (0, 1), 0.90), _plan("b", (1,), 0.90)], False),
        ([_plan("a", (0,), 0.5), _plan("b", (0,), 0.3), _plan("c", (0,), 0.2)], False),
    ],
)
def test_gpu_sharing(plans: list[Plan], ok: bool) -> None:
    """Deployments sharing a GPU must keep their utilisations at or below 0.95 in sum (exit 4 otherwise)."""
    if ok:
        checks.check_gpu_sharing(plans)
        return
    with pytest.raises(InfeasiblePlan) as info:
        checks.check_gpu_sharing(plans)
    assert "above 0.95" in info.value.message


@pytest.mark.parametrize(
    ("plans", "swap", "ok"),
    [
        # One group of two at 0.9: one awake at a time.
        ([_plan("a", (0,), 0.9), _plan("b", (0,), 0.9)], {"a": ("g", False), "b": ("g", False)}, True),
        # A pinned member and another: both may be awake at once.
        ([_plan("a", (0,), 0.9), _plan("b", (0,), 0.9)], {"a": ("g", True), "b": ("g", False)}, False),
        (
            [_plan("a", (0,), 0.5), _plan("b", (0,), 0.4), _plan("c", (0,), 0.4)],
            {"a": ("g", True), "b": ("g", False), "c": ("g", False)},
            True,
        ),
        # A member beside a deployment outside the group: they must fit together.
        ([_plan("a", (0,), 0.9), _plan("x", (0,), 0.2)], {"a": ("g", False)}, False),
        # Two groups on one GPU: the largest of each is awake.
        (
            [_plan("a", (0,), 0.5), _plan("b", (0,), 0.3), _plan("c", (0,), 0.45), _plan("d", (0,), 0.2)],
            {"a": ("g", False), "b": ("g", False), "c": ("h", False), "d": ("h", False)},
            True,
        ),
    ],
)
def test_gpu_sharing_counts_a_swap_groups_awake_members(
    plans: list[Plan], swap: dict[str, tuple[str, bool]], ok: bool
) -> None:
    """Swap group members count as the pinned ones plus the largest other: the rest sleep."""
    members = {name: checks.SwapMembership(group, pinned) for name, (group, pinned) in swap.items()}
    if ok:
        checks.check_gpu_sharing(plans, members)
        return
    with pytest.raises(InfeasiblePlan, match=r"above 0\.95"):
        checks.check_gpu_sharing(plans, members)


def test_suggestions_skip_dtypes_the_release_lacks() -> None:
    """Suggestions only name dtypes the target release has."""
    assert checks.suggest_kv_cache_dtypes("q4_0", caps("0.33.0").kv_cache_dtypes)[0] == "int4_per_token_head"
    assert checks.suggest_kv_cache_dtypes("q4_0", caps("0.10.0").kv_cache_dtypes) == ()


def test_qwen_fits_one_h100() -> None:
    """Qwen3-30B-A3B bf16 fits one H100 at 0.90 with room left for KV cache."""
    fit = rules.gpu_fit(1, int(0.9 * 79.6 * GIB), QWEN3_30B.parameter_bytes or 0)
    checks.check_weights_fit(fit, QWEN3_30B, 1, 0.9)
    assert fit.kv_capacity > 10 * GIB
    assert replace(fit, budget=fit.weights).fits is False
