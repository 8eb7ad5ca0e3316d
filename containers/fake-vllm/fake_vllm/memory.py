"""GPU memory model of one boot, following vLLM 0.33's own arithmetic (pure).

Sources in the 0.33 wheel: vllm/v1/worker/utils.py (request_memory), vllm/v1/worker/gpu_worker.py
(determine_available_memory, the `--kv-cache-memory=<int>` suggestion in
compile_or_warm_up_model), vllm/v1/core/kv_cache_planning.py (the max-length check and its
estimate, auto-fit), vllm/v1/core/kv_cache_utils.py (KV size and concurrency).
With VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS on (0.33's default) the CUDA-graph estimate is
part of the peak activation, and the suggestion then subtracts the captured graph memory
again: the double count of vllm issue 57936 is reproduced on purpose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

MIB: Final = 1 << 20
GIB: Final = 1 << 30
BLOCK_SIZE: Final = 16
REDUNDANCY_BUFFER_BYTES: Final = 150 * MIB  # gpu_worker.py: "leave a small buffer (=150MiB)"

# The measured model's shape (1.1 B parameters, 16 layers): memory besides weights and KV.
NON_TORCH_BYTES: Final = 120 * MIB
NCCL_BYTES_PER_EXTRA_RANK: Final = 256 * MIB
ACTIVATION_BASE_BYTES: Final = 96 * MIB
ACTIVATION_BYTES_PER_BATCHED_TOKEN: Final = 128 * 1024
CUDAGRAPH_ESTIMATE_BYTES: Final = 320 * MIB
CUDAGRAPH_ACTUAL_BYTES: Final = 276 * MIB
PER_RANK_SKEW_BYTES: Final = 2 * MIB  # ranks differ a little, as on real multi-GPU boots

Outcome = Literal[
    "ok",
    "free_below_requested",
    "weights_oom",
    "no_kv_memory",
    "max_len_too_large",
    "auto_fit_impossible",
    "kv_allocation_oom",
]
Forced = Literal["no_kv_memory", "max_len_too_large", "oom_load"] | None


@dataclass(frozen=True)
class MemoryInputs:
    """What decides the memory of one boot."""

    total_bytes: int
    used_by_others_bytes: int
    model_bytes: int
    kv_bytes_per_token: int  # all layers, at 16-bit KV
    model_max_len: int
    tensor_parallel_size: int
    gpu_memory_utilization: float
    max_model_len: int | None
    kv_cache_memory_bytes: int | None
    kv_cache_dtype: str
    max_num_batched_tokens: int
    enforce_eager: bool
    activation_jitter_bytes: int
    forced: Forced


@dataclass(frozen=True)
class RankMemory:
    """One GPU's figures, named as gpu_worker.py names them."""

    rank: int
    total: int
    init_free: int
    requested: int
    weights: int
    non_torch: int
    transient_peak: int
    cudagraph_estimate: int
    cudagraph_actual: int
    available_kv: int

    @property
    def total_consumed(self) -> int:
        return self.weights + self.non_torch

    @property
    def peak_activation(self) -> int:
        return self.transient_peak + self.cudagraph_estimate

    @property
    def suggestion_to_requested(self) -> int:
        """The first `--kv-cache-memory=<int>` of the suggestion line (fit into requested memory)."""
        non_kv = self.total_consumed + self.peak_activation + self.cudagraph_actual
        return int(self.requested) - non_kv - REDUNDANCY_BUFFER_BYTES

    @property
    def suggestion_to_gpu(self) -> int:
        """The second `--kv-cache-memory=<int>` (fully utilize gpu memory)."""
        non_kv = self.total_consumed + self.peak_activation + self.cudagraph_actual
        return self.init_free - non_kv - REDUNDANCY_BUFFER_BYTES


@dataclass(frozen=True)
class MemoryPlan:
    """The figures a boot logs, and whether its KV cache fits."""

    ranks: tuple[RankMemory, ...]
    profiled: bool  # False when --kv-cache-memory-bytes skipped memory profiling
    kv_bytes_per_token_rank: int
    derived_max_model_len: int
    max_model_len: int
    auto_fit: Literal["full", "reduced"] | None
    needed_kv_bytes: int
    estimated_max_model_len: int
    kv_tokens: int
    max_concurrency: float
    outcome: Outcome

    @property
    def limiting_rank(self) -> RankMemory:
        return min(self.ranks, key=lambda rank: rank.available_kv)


def kv_dtype_divisor(kv_cache_dtype: str) -> int:
    """How much smaller than 16-bit one KV element is for a `--kv-cache-dtype`."""
    name = kv_cache_dtype.lower()
    if "4bit" in name or "int4" in name or name.startswith("nvfp4") or name.startswith("octave_k3v3"):
        return 4
    if name.startswith(("fp8", "int8", "turboquant", "octave")):
        return 2
    return 1


def format_gib(value: float) -> str:
    """vLLM's format_gib: `str(round(b / GiB, 2))`, so 80.0 and 18.69, never 80.00."""
    return f"{round(value / GIB, 2)}"


def plan_memory(inputs: MemoryInputs) -> MemoryPlan:
    """Run vLLM's memory arithmetic for one boot."""
    tp = max(1, inputs.tensor_parallel_size)
    init_free = max(0, inputs.total_bytes - inputs.used_by_others_bytes)
    requested = math.ceil(inputs.total_bytes * inputs.gpu_memory_utilization)
    weights = math.ceil(inputs.model_bytes / tp)
    non_torch = NON_TORCH_BYTES + (NCCL_BYTES_PER_EXTRA_RANK if tp > 1 else 0)
    transient = max(
        0,
        ACTIVATION_BASE_BYTES
        + ACTIVATION_BYTES_PER_BATCHED_TOKEN * inputs.max_num_batched_tokens
        + inputs.activation_jitter_bytes,
    )
    graph_estimate = 0 if inputs.enforce_eager else CUDAGRAPH_ESTIMATE_BYTES
    graph_actual = 0 if inputs.enforce_eager else CUDAGRAPH_ACTUAL_BYTES
    bytes_per_token_rank = max(1, math.ceil(inputs.kv_bytes_per_token / kv_dtype_divisor(inputs.kv_cache_dtype) / tp))
    page_bytes = BLOCK_SIZE * bytes_per_token_rank
    derived = inputs.model_max_len
    max_len = derived if inputs.max_model_len in (None, -1) else int(inputs.max_model_len or derived)

    ranks: list[RankMemory] = []
    for rank in range(tp):
        rank_transient = transient + rank * PER_RANK_SKEW_BYTES
        if inputs.kv_cache_memory_bytes is not None:
            available = inputs.kv_cache_memory_bytes
        else:
            available = requested - (weights + non_torch + rank_transient) - graph_estimate
        if inputs.forced == "no_kv_memory":
            available = -abs(available) // 8 - GIB
        elif inputs.forced == "max_len_too_large":
            available = math.ceil(max_len / BLOCK_SIZE) * page_bytes * 35 // 100
        ranks.append(
            RankMemory(
                rank=rank,
                total=inputs.total_bytes,
                init_free=init_free,
                requested=requested,
                weights=weights,
                non_torch=non_torch,
                transient_peak=rank_transient,
                cudagraph_estimate=graph_estimate,
                cudagraph_actual=graph_actual,
                available_kv=available,
            )
        )
    limiting = min(rank.available_kv for rank in ranks)
    estimated = max(0, limiting) // page_bytes * BLOCK_SIZE
    auto_fit: Literal["full", "reduced"] | None = None
    outcome: Outcome = "ok"
    if init_free < requested:
        outcome = "free_below_requested"
    elif weights + non_torch > init_free or inputs.forced == "oom_load":
        outcome = "weights_oom"
    elif limiting <= 0:
        outcome = "no_kv_memory"
    elif inputs.max_model_len == -1:
        if estimated <= 0:
            outcome = "auto_fit_impossible"
        elif estimated >= derived:
            auto_fit = "full"
        else:
            auto_fit, max_len = "reduced", estimated
    needed = math.ceil(max_len / BLOCK_SIZE) * page_bytes
    if outcome == "ok" and needed > limiting:
        outcome = "max_len_too_large"
    if outcome == "ok" and inputs.kv_cache_memory_bytes is not None:
        # Given bytes skip profiling: nothing checks they fit until the KV tensors are allocated.
        in_use = weights + non_torch + transient + (ranks[-1].transient_peak - transient)
        if in_use + inputs.kv_cache_memory_bytes > init_free:
            outcome = "kv_allocation_oom"
    blocks = max(0, limiting) // page_bytes
    concurrency = blocks / math.ceil(max_len / BLOCK_SIZE) if max_len > 0 else 0.0
    return MemoryPlan(
        ranks=tuple(ranks),
        profiled=inputs.kv_cache_memory_bytes is None,
        kv_bytes_per_token_rank=bytes_per_token_rank,
        derived_max_model_len=derived,
        max_model_len=max_len,
        auto_fit=auto_fit,
        needed_kv_bytes=needed,
        estimated_max_model_len=estimated,
        kv_tokens=int(concurrency * max_len),
        max_concurrency=concurrency,
        outcome=outcome,
    )


def sleep_freed(plan: MemoryPlan) -> int:
    """GPU memory a sleep frees on rank 0 (either level): the weights (copied to CPU RAM at level 1,
    dropped at level 2) and the KV cache."""
    rank = plan.ranks[0]
    return rank.weights + max(0, rank.available_kv)


def asleep_used(plan: MemoryPlan) -> int:
    """GPU memory rank 0 still uses asleep: what was in use before vLLM, its non-torch memory, CUDA graphs."""
    rank = plan.ranks[0]
    return (rank.total - rank.init_free) + rank.non_torch + rank.cudagraph_actual
