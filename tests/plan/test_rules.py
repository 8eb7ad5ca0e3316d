"""Tests for dankserve.plan.rules: every seed-table row, each rule's choices, and monotonic rules."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dankserve.host.model import Memory
from dankserve.plan import rules
from dankserve.settings import CpuOffloadSettings, SpeculativeSettings
from tests.plan.builders import GIB, LLAMA_70B, QWEN3_30B, caps, gpu, host

STALE_SEED_SENTENCE = ("leave more", "more gpu memory for kv", "more memory for kv")


@pytest.mark.parametrize(
    ("name", "mib", "cc", "expected"),
    [
        ("NVIDIA GeForce RTX 3090", 24576, (8, 6), 0.70),
        ("NVIDIA GeForce RTX 4090", 24564, (8, 9), 0.70),
        ("NVIDIA A100-PCIE-40GB", 40960, (8, 0), 0.80),
        ("NVIDIA A100-SXM4-80GB", 81920, (8, 0), 0.85),
        ("NVIDIA H100 80GB HBM3", 81559, (9, 0), 0.90),
        ("NVIDIA H200", 143771, (9, 0), 0.90),
        ("Tesla T4", 15360, (7, 5), 0.70),
        ("NVIDIA L40S", 46068, (8, 9), 0.80),
        ("NVIDIA B200", 183359, (10, 0), 0.90),
    ],
)
def test_utilisation_seed_table(name: str, mib: int, cc: tuple[int, int], expected: float) -> None:
    """Each seed row maps to the lower end of its band; H100/H200-class 80 GB+ gets 0.90."""
    decision = rules.gpu_memory_utilization([gpu(memory_gib=mib / 1024, cc=cc, name=name)], None)
    assert decision.value == expected
    assert name in decision.reason
    assert not any(s in decision.reason.lower() for s in STALE_SEED_SENTENCE)


def test_utilisation_follows_the_smallest_gpu_and_config() -> None:
    """The smallest assigned GPU picks the row; a configured value wins."""
    mixed = [gpu(0, memory_gib=80, cc=(9, 0)), gpu(1, memory_gib=40, cc=(8, 0), name="NVIDIA A100-PCIE-40GB")]
    assert rules.gpu_memory_utilization(mixed, None).value == 0.80
    assert rules.gpu_memory_utilization(mixed, 0.45).value == 0.45


@given(
    small=st.floats(min_value=4, max_value=300),
    extra=st.floats(min_value=0, max_value=300),
    cc=st.sampled_from([(7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)]),
)
def test_utilisation_non_decreasing_in_gpu_size(small: float, extra: float, cc: tuple[int, int]) -> None:
    """For one architecture, a bigger GPU never gets a smaller utilisation."""
    low = rules.gpu_memory_utilization([gpu(memory_gib=small, cc=cc)], None).value
    high = rules.gpu_memory_utilization([gpu(memory_gib=small + extra, cc=cc)], None).value
    assert low <= high


@pytest.mark.parametrize(
    ("ram_gib", "expected"),
    [(16, None), (31.3, 8), (32, 8), (62.7, 16), (64, 16), (96, 16), (125.5, 32), (128, 32), (251.6, 64), (1024, 64)],
)
def test_swap_seed_table(ram_gib: float, expected: float | None) -> None:
    """Each seed swap row gives its lower end (8/16/32/64 GiB); below 32 GB no offload; above 256 the last row."""
    memory = Memory(total_bytes=int(ram_gib * GIB), available_bytes=int(ram_gib * GIB))
    assert rules.kv_offload_gib(memory, "auto").value == expected


@pytest.mark.parametrize(
    ("available_gib", "expected"),
    [(200, 32.0), (20.7, 20.0), (0.5, None)],
)
def test_swap_capped_by_available_ram(available_gib: float, expected: float | None) -> None:
    """The table value is capped, in whole GiB, by the RAM available; under 1 GiB there is no offload."""
    memory = Memory(total_bytes=128 * GIB, available_bytes=int(available_gib * GIB))
    assert rules.kv_offload_gib(memory, "auto").value == expected


def test_swap_configured_and_off() -> None:
    """A configured GiB amount is used as is; off means no offload."""
    memory = Memory(total_bytes=64 * GIB, available_bytes=60 * GIB)
    assert rules.kv_offload_gib(memory, 12.5).value == 12.5
    assert rules.kv_offload_gib(memory, "off").value is None


@given(
    total=st.integers(min_value=1 * GIB, max_value=4096 * GIB),
    more=st.integers(min_value=0, max_value=4096 * GIB),
    available=st.integers(min_value=0, max_value=4096 * GIB),
)
def test_offload_non_decreasing_in_ram_and_within_available(total: int, more: int, available: int) -> None:
    """More RAM never lowers the offload, and it never exceeds the RAM available."""
    low = rules.kv_offload_gib(Memory(total_bytes=total, available_bytes=available), "auto").value or 0
    high = rules.kv_offload_gib(Memory(total_bytes=total + more, available_bytes=available), "auto").value or 0
    assert low <= high
    assert high * GIB <= available


@given(
    total=st.integers(min_value=1 * GIB, max_value=4096 * GIB),
    sharers=st.integers(min_value=1, max_value=12),
    fixed=st.lists(st.floats(min_value=0, max_value=512), max_size=3),
)
def test_auto_offloads_of_the_deployments_together_fit_the_host(total: int, sharers: int, fixed: list[float]) -> None:
    """However many deployments are on auto (and whatever others set by hand), their auto amounts together stay
    within the RAM the host gives to offload, less the amounts set by hand."""
    share = rules.offload_share(total, [*(["auto"] * sharers), *fixed])
    each = rules.kv_offload_gib(Memory(total_bytes=total, available_bytes=total), "auto", share).value or 0
    assert sharers * each * GIB <= max(0, rules.host_ram_limit(total) - sum(int(f * GIB) for f in fixed))


def test_auto_offload_off_when_the_share_is_under_a_gib() -> None:
    """Too many deployments for the host's RAM: auto is off, and the reason says how the RAM is shared."""
    share = rules.offload_share(64 * GIB, ["auto"] * 100)
    decision = rules.kv_offload_gib(Memory(total_bytes=64 * GIB, available_bytes=64 * GIB), "auto", share)
    assert decision.value is None and "100 deployment(s) on auto share" in decision.reason


@pytest.mark.parametrize(
    ("version", "tp", "expected"),
    [
        ("0.33.0", 4, [("--kv-offloading-size", "32"), ("--kv-offloading-backend", "native")]),
        ("0.12.0", 2, [("--kv-offloading-size", "32"), ("--kv-offloading-backend", "native")]),
        ("0.11.0", 4, [("--swap-space", "8")]),
        ("0.10.0", 3, [("--swap-space", "10.67")]),
    ],
)
def test_offload_spelling_per_release(version: str, tp: int, expected: list[tuple[str, str]]) -> None:
    """--kv-offloading-size is a total over TP ranks; releases without it get --swap-space per GPU."""
    spelt = rules.kv_offload_flags(32, tp, caps(version))
    assert [(f, v) for f, v, _ in spelt.flags] == expected


@pytest.mark.parametrize(
    ("tp", "heads", "kv_heads", "ok"),
    [(1, 32, 4, True), (2, 32, 4, True), (8, 32, 4, True), (3, 48, 8, False), (3, 24, 3, True), (6, 48, 4, False),
     (16, 64, 8, True), (5, 40, None, True), (4, None, None, True)],
)  # fmt: skip
def test_divides_heads(tp: int, heads: int | None, kv_heads: int | None, ok: bool) -> None:
    """TP must divide the heads; KV heads must divide by TP or TP by them (vLLM's QKV split)."""
    assert rules.divides_heads(tp, heads, kv_heads) is ok


def test_tp_fewest_gpus_that_fit() -> None:
    """A model that fits on one GPU gets TP 1; Llama 70B bf16 needs 2 H100s at 0.90, 4 A100 40 GB at 0.80."""
    h100 = int(0.90 * 79.6 * GIB)
    assert rules.tensor_parallel_size(4, h100, QWEN3_30B, None).value == 1
    assert rules.tensor_parallel_size(4, h100, LLAMA_70B, None).value == 2
    a100_40 = int(0.80 * 40 * GIB)
    assert rules.tensor_parallel_size(8, a100_40, LLAMA_70B, None).value == 8  # 4 would need 32.9 + 2 > 32 GiB


def test_tp_counts_one_sequence_of_kv() -> None:
    """With a context length set, the chosen TP also holds one sequence of KV cache."""
    budget = int(0.90 * 79.6 * GIB)
    one_seq = {t: int(131072 * 2 * 80 * max(1, 8 // t) * 128 * 2) for t in (1, 2, 4)}
    assert rules.tensor_parallel_size(4, budget, LLAMA_70B, None, kv_one_sequence_at=one_seq).value == 4


def test_tp_skips_splits_that_do_not_divide_heads() -> None:
    """A 3-GPU split is skipped when it does not divide the heads."""
    model = replace(QWEN3_30B, parameter_bytes=100 * GIB)
    assert rules.tensor_parallel_size(3, 40 * GIB, model, None).value == 2
    assert rules.tensor_parallel_size(3, 40 * GIB, model, 3).value == 3  # configured: validated by the checks


def test_tp_with_unknown_model_takes_a_power_of_two() -> None:
    """An unknown model size gets all assigned GPUs in a power-of-two split, and says so."""
    unknown = replace(QWEN3_30B, parameter_bytes=None, num_attention_heads=None, num_key_value_heads=None)
    decision = rules.tensor_parallel_size(6, 70 * GIB, unknown, None)
    assert decision.value == 4
    assert "unknown" in decision.reason


@given(
    small=st.integers(min_value=1 * GIB, max_value=2000 * GIB),
    extra=st.integers(min_value=0, max_value=2000 * GIB),
    gpus=st.integers(min_value=1, max_value=8),
    budget_gib=st.integers(min_value=8, max_value=140),
)
def test_tp_non_decreasing_in_model_size(small: int, extra: int, gpus: int, budget_gib: int) -> None:
    """A bigger model never gets a smaller tensor-parallel size."""
    low = rules.tensor_parallel_size(gpus, budget_gib * GIB, replace(QWEN3_30B, parameter_bytes=small), None)
    high = rules.tensor_parallel_size(gpus, budget_gib * GIB, replace(QWEN3_30B, parameter_bytes=small + extra), None)
    assert low.value <= high.value


@pytest.mark.parametrize(
    ("configured", "capacity", "auto", "expected"),
    [
        (8192, 10 * GIB, True, "8192"),
        ("auto", 10 * GIB, False, "auto"),
        (None, 10 * GIB, True, None),  # 40960 tokens x 96 KiB = 3.75 GiB fits
        (None, 2 * GIB, True, "auto"),
        (None, 2 * GIB, False, "21840"),  # 2 GiB / 96 KiB, rounded down to 16
        (None, None, True, None),
    ],
)
def test_max_model_len(configured: int | str | None, capacity: int | None, auto: bool, expected: str | None) -> None:
    """The model's own length when its KV fits; else auto (0.14+) or the largest length that fits."""
    per_token = QWEN3_30B.kv_bytes_per_token(2, 1)
    decision = rules.max_model_len(
        configured,  # type: ignore[arg-type]
        QWEN3_30B,
        kv_capacity=capacity,
        kv_bytes_per_token=per_token,
        supports_auto=auto,
    )
    assert decision.value == expected


@pytest.mark.parametrize(
    ("cc", "backend", "ok"),
    [
        ((8, 0), None, False), ((8, 6), None, False), ((8, 9), None, True), ((9, 0), None, True), ((12, 0), None, True),
        ((8, 6), "TRITON_ATTN", False), ((8, 9), "TRITON_ATTN", True),
        ((8, 9), "FLASH_ATTN", False), ((9, 0), "FLASH_ATTN", True), ((10, 0), "FLASH_ATTN", True),
        ((12, 0), "FLASH_ATTN", False),
        ((8, 0), "FLASHINFER", True), ((12, 1), "FLASHINFER", True), ((7, 5), "FLASHINFER", False),
        ((9, 0), "FLEX_ATTENTION", False),
    ],
)  # fmt: skip
def test_fp8_support_by_backend_and_sm(cc: tuple[int, int], backend: str | None, ok: bool) -> None:
    """fp8 KV: Triton from SM 8.9, FlashAttention on 9.0/10.0, FlashInfer on 8.0-12.1 (FACTS.md)."""
    assert rules.fp8_supported(cc, backend)[0] is ok


def test_kv_cache_dtype_choices() -> None:
    """fp8 where supported, auto elsewhere, the config's value always."""
    assert rules.kv_cache_dtype(None, (9, 0), None, caps()).value == "fp8"
    assert rules.kv_cache_dtype(None, (8, 0), None, caps()).value == "auto"
    assert rules.kv_cache_dtype(None, (8, 0), "FLASHINFER", caps()).value == "fp8"
    assert rules.kv_cache_dtype("int8_per_token_head", (8, 0), None, caps()).value == "int8_per_token_head"


@pytest.mark.parametrize(
    ("profile", "speculative", "tokens", "seqs"),
    [("throughput", False, 8192, 128), ("latency", False, 4096, 32), ("throughput", True, 8192, 32),
     ("latency", True, 4096, 32)],
)  # fmt: skip
def test_batching_from_profile(profile: str, speculative: bool, tokens: int, seqs: int) -> None:
    """The seeds' examples: 8192/128 for throughput, 4096/32 for latency, 32 sequences with speculation."""
    assert rules.max_num_batched_tokens(profile, None).value == tokens  # type: ignore[arg-type]
    assert rules.max_num_seqs(profile, speculative, None).value == seqs  # type: ignore[arg-type]
    assert rules.max_num_seqs(profile, speculative, 7).value == 7  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("spec", "profile", "expected"),
    [
        (SpeculativeSettings(method="dflash", model="z-lab/Qwen3.6-35B-A3B-DFlash"), "throughput",
         '{"method":"dflash","model":"z-lab/Qwen3.6-35B-A3B-DFlash","num_speculative_tokens":8}'),
        (SpeculativeSettings(method="dflash", model="z"), "latency",
         '{"method":"dflash","model":"z","num_speculative_tokens":16}'),
        (SpeculativeSettings(method="ngram", tokens=4), "latency", '{"method":"ngram","num_speculative_tokens":4}'),
    ],
)  # fmt: skip
def test_speculative_config_is_compact_sorted_json(spec: SpeculativeSettings, profile: str, expected: str) -> None:
    """--speculative-config is compact JSON with sorted keys; 8 tokens for throughput, 16 for latency."""
    value = rules.speculative_config(spec, profile).value  # type: ignore[arg-type]
    assert value == expected
    assert json.loads(value)["method"] == spec.method


def test_cpu_offload_only_when_configured() -> None:
    """Weights stay on the GPU unless cpu_offload is configured."""
    assert rules.cpu_offload(None).value is None
    configured = CpuOffloadSettings(gib=16, params=["experts"])
    assert rules.cpu_offload(configured).value == configured


@pytest.mark.parametrize(
    ("numa_nodes", "gpu_nodes", "configured", "expected"),
    [
        (1, (0, 0), None, None),
        (2, (0, 0, 1, 1), None, (0, 0, 1, 1)),
        (2, (1, 0), None, (1, 0)),
        (2, (None, 1), None, ()),
        (2, (0, 1), False, None),
        (1, (0,), True, (0,)),
    ],
)
def test_numa_binding(
    numa_nodes: int, gpu_nodes: tuple[int | None, ...], configured: bool | None, expected: tuple[int, ...] | None
) -> None:
    """Several NUMA nodes bind each GPU's worker to its node (one entry per GPU); unknown nodes bind without a list."""
    gpus = tuple(gpu(i, numa=n) for i, n in enumerate(gpu_nodes))
    the_host = host(gpus=gpus, numa_nodes=numa_nodes)
    assert rules.numa_binding(the_host, gpus, configured).value == expected


def test_container_env() -> None:
    """The env carries the cache root (Triton's and FlashInfer's caches under it), PCI order, no colour, no logo;
    NUMA adds spawn; the config's env wins."""
    env = rules.container_env("/root/.cache/vllm", True, {"NO_COLOR": "0", "HF_HUB_OFFLINE": "1"})
    assert env == {
        "VLLM_CACHE_ROOT": "/root/.cache/vllm",
        "TRITON_CACHE_DIR": "/root/.cache/vllm/triton",
        "FLASHINFER_WORKSPACE_BASE": "/root/.cache/vllm/flashinfer",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "NO_COLOR": "0",
        "VLLM_DISABLE_LOG_LOGO": "1",
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        "HF_HUB_OFFLINE": "1",
    }
    assert "VLLM_WORKER_MULTIPROC_METHOD" not in rules.container_env("/c", False, {})


def test_host_warnings() -> None:
    """Fewer than 8 physical cores and MIG on an assigned GPU are warned about."""
    assert rules.host_warnings(host(cores=8), [gpu()]) == ()
    few = rules.host_warnings(host(cores=6), [gpu()])
    assert len(few) == 1 and "6 physical CPU cores" in few[0]
    mig = rules.host_warnings(host(), [gpu(0), gpu(1, mig=True)])
    assert len(mig) == 1 and "MIG" in mig[0] and "GPU 1" in mig[0]


@pytest.mark.parametrize(("value", "text"), [(16.0, "16"), (10.666, "10.67"), (0.5, "0.5"), (8, "8")])
def test_number_formatting(value: float, text: str) -> None:
    """Numbers are spelt as vLLM takes them: integers bare, others with up to two decimals."""
    assert rules.number(value) == text


def test_vllms_own_startup_plan_is_warned_about() -> None:
    """VLLM_ENABLE_STARTUP_PLAN=1 in a deployment's env gets a warning naming the fix; unset or 0 does not."""
    (warning,) = rules.env_warnings({"VLLM_ENABLE_STARTUP_PLAN": "1"})
    assert "Remove it from the deployment's env" in warning
    assert rules.env_warnings({"VLLM_ENABLE_STARTUP_PLAN": "0"}) == []
    assert rules.env_warnings({}) == []
