"""The planner's rules: one pure function per rule, each returning its value and the reason.

Where the seed notes give a range, the rule takes a stated point of it; docs/planner.md lists
every rule with its source (seed table, FACTS.md, or vLLM's source).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from dankserve.host.model import Gpu, Host, Memory
from dankserve.plan.catalogue import VllmCapabilities
from dankserve.plan.models import ModelFacts
from dankserve.plan.types import Capacity
from dankserve.settings import CpuOffloadSettings, Profile, SpeculativeSettings

T = TypeVar("T")
GIB = 1 << 30

RUNTIME_RESERVE_BYTES = 2 * GIB
"""Per-GPU memory vLLM needs besides weights and KV cache (CUDA context outside its own
accounting, the activation peak of one scheduled batch, CUDA graphs): an estimate."""


@dataclass(frozen=True)
class Decision(Generic[T]):
    """A rule's value and why it was chosen."""

    value: T
    reason: str


def gib(value: float) -> str:
    """Bytes as GiB for reasons and messages ('57.3 GiB')."""
    return f"{value / GIB:.1f} GiB"


def number(value: float) -> str:
    """A number as vLLM takes it: integers bare, others with up to two decimals."""
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.2f}".rstrip("0").rstrip(".")


# --------------------------------------------------------------------------- GPU memory utilisation


@dataclass(frozen=True)
class UtilisationRow:
    """One row of the seeds' `--gpu-memory-utilization` table, and the point of its band we take."""

    label: str
    band: str
    value: float
    top: float
    """The band's upper end: where a no-KV-memory remediation raises an unset utilisation."""


# Recommended bands (the project's seed notes, "GPU Memory Utilization"). The fraction caps
# everything vLLM allocates on the GPU; the planner takes the lowest point of the band that
# holds the weights, the runtime reserve and one request's KV cache, leaving the most headroom
# for CUDA-graph and activation estimates that run over and for other GPU users.
UTIL_24GB = UtilisationRow("24 GB cards (RTX 3090/4090) and smaller", "0.70-0.80", 0.70, 0.80)
UTIL_40GB = UtilisationRow("40-48 GB cards (A100 40 GB, L40S, RTX 6000)", "0.80-0.90", 0.80, 0.90)
UTIL_80GB_A100 = UtilisationRow("80 GB cards before Hopper (A100 80 GB)", "0.85-0.95", 0.85, 0.95)
UTIL_80GB_H100 = UtilisationRow("80 GB Hopper cards (H100)", "0.90-0.95", 0.90, 0.95)
UTIL_ABOVE_80GB = UtilisationRow("cards above 80 GB (H200 141 GB, B200)", "0.90-0.95", 0.90, 0.95)

CLASS_40GB_MIN_GIB = 32
CLASS_80GB_MIN_GIB = 60
CLASS_ABOVE_80GB_MIN_GIB = 100


def utilisation_row(gpu: Gpu) -> UtilisationRow:
    """The recommended band of a GPU: by nominal size class; at 80 GB, by architecture."""
    size_gib = gpu.memory_total_bytes / GIB
    if size_gib < CLASS_40GB_MIN_GIB:
        return UTIL_24GB
    if size_gib < CLASS_80GB_MIN_GIB:
        return UTIL_40GB
    if size_gib < CLASS_ABOVE_80GB_MIN_GIB:
        return UTIL_80GB_H100 if tuple(gpu.compute_capability) >= (9, 0) else UTIL_80GB_A100
    return UTIL_ABOVE_80GB


def smallest_gpu(gpus: Sequence[Gpu]) -> Gpu:
    """The assigned GPU with the least memory (ties: the older architecture)."""
    return min(gpus, key=lambda g: (g.memory_total_bytes, tuple(g.compute_capability), g.index))


VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
"""What vLLM takes without `--gpu-memory-utilization` (its EngineArgs default): the share counted for a
swap group member before its first plan says its own."""


def gpu_memory_utilization(gpus: Sequence[Gpu], configured: float | None) -> Decision[float]:
    """`--gpu-memory-utilization` before any fit is known: the config's value, else the band's lowest point."""
    if configured is not None:
        return Decision(configured, "set in config (gpu_memory_utilization)")
    gpu = smallest_gpu(gpus)
    row = utilisation_row(gpu)
    return Decision(
        row.value,
        f"recommended for {row.label}: {row.band}; the lowest point, as the model's size is unknown "
        f"(smallest assigned GPU: {gpu.name}, {gib(gpu.memory_total_bytes)}); it caps all of vLLM's memory per GPU",
    )


def _round_up(fraction: float) -> float:
    return math.ceil(fraction * 100 - 1e-9) / 100


AUTO_GROUP_MIN_UTILISATION = 0.05
"""The least share an `auto` swap group member plans (the CUDA context, graphs and a little KV)."""


def utilisation_for_bytes(gpus: Sequence[Gpu], required: int, desired: int, desired_what: str) -> Decision[float]:
    """A `swap_group = "auto"` member's share: just what holds `desired` bytes per GPU (rounded up to a
    hundredth), below the band too, so small members are awake together; at most the band's top."""
    gpu = smallest_gpu(gpus)
    row = utilisation_row(gpu)
    memory = gpu.memory_total_bytes
    value = max(AUTO_GROUP_MIN_UTILISATION, _round_up(desired / memory))
    if value <= row.top:
        return Decision(value, f'swap_group = "auto": {value:.2f}, what holds {desired_what} ({gib(desired)})')
    return utilisation_by_fit(gpus, required, desired, desired_what)


def utilisation_by_fit(gpus: Sequence[Gpu], required: int, desired: int, desired_what: str) -> Decision[float]:
    """The lowest point of the recommended band that holds `desired` bytes per GPU (weights, reserve
    and one request's KV cache at the wanted context), else the band's top.

    `required` is what must fit at all (weights, reserve, and the KV of a configured context);
    when even the top does not hold it the top is returned and the fit checks refuse with the numbers.
    """
    gpu = smallest_gpu(gpus)
    row = utilisation_row(gpu)
    memory = gpu.memory_total_bytes
    band = f"recommended for {row.label}: {row.band}"
    holds = f"{desired_what} ({gib(desired)} of the {gib(memory)} GPU)"
    if desired <= row.value * memory:
        return Decision(row.value, f"{band}; its lowest point already holds {holds}, the rest stays free")
    if desired <= row.top * memory:
        value = min(row.top, _round_up(desired / memory))
        return Decision(value, f"{band}; {value:.2f}, the lowest point that holds {holds}")
    if required <= row.top * memory:
        return Decision(
            row.top,
            f"{band}; its top, since no point of the band holds {holds}: the context shrinks to what fits",
        )
    return Decision(row.top, f"{band}; its top, and even that does not hold the weights (see the error)")


# --------------------------------------------------------------------------- CPU KV offload (swap)


@dataclass(frozen=True)
class SwapRow:
    ram_gib: int
    band: str
    value_gib: int


# Seed table ("Swap Space" by system RAM), lower end of each band. A row applies from 90 % of
# its nominal size, since the OS reports a little less than the installed RAM.
SWAP_TABLE = (
    SwapRow(32, "8-16", 8),
    SwapRow(64, "16-32", 16),
    SwapRow(128, "32-64", 32),
    SwapRow(256, "64-128", 64),
)
SWAP_ROW_TOLERANCE = 0.9


def swap_row(total_bytes: int) -> SwapRow | None:
    """The largest seed-table row a host's RAM reaches, or None below the first row."""
    rows = [row for row in SWAP_TABLE if total_bytes >= row.ram_gib * GIB * SWAP_ROW_TOLERANCE]
    return rows[-1] if rows else None


HOST_RAM_RESERVE_FRACTION = 0.125
HOST_RAM_RESERVE_MIN = 8 << 30


def host_ram_limit(total_bytes: int) -> int:
    """RAM the servers may pin for CPU offload: the total less a reserve for the OS, vLLM's own
    processes and the page cache (max(8 GiB, 1/8)). The total, not the live available RAM: that
    already lacks what running servers pinned, so a plan made beside them would refuse itself."""
    return max(0, total_bytes - max(HOST_RAM_RESERVE_MIN, int(total_bytes * HOST_RAM_RESERVE_FRACTION)))


@dataclass(frozen=True)
class OffloadShare:
    """The host RAM the deployments on `kv_offload = "auto"` share: what the host gives to CPU offload
    (host_ram_limit) less the amounts other deployments set by hand, split evenly among them."""

    budget_bytes: int
    fixed_bytes: int
    """kv_offload GiB set by hand in the other deployments."""
    sharers: int
    """Deployments on auto, this one included."""

    @property
    def each_gib(self) -> int:
        return max(0, self.budget_bytes - self.fixed_bytes) // max(1, self.sharers) // GIB

    def describe(self) -> str:
        fixed = f" less the {gib(self.fixed_bytes)} set by hand" if self.fixed_bytes else ""
        return (
            f"{self.sharers} deployment(s) on auto share the {gib(self.budget_bytes)} this host gives to CPU "
            f"offload{fixed}: {self.each_gib} GiB each"
        )


def offload_share(total_ram_bytes: int, offloads: Sequence[float | str]) -> OffloadShare:
    """The share of the host's offload RAM among deployments with these kv_offload settings (every enabled
    deployment on this host, the one planned included)."""
    fixed = sum(int(value * GIB) for value in offloads if not isinstance(value, str))
    return OffloadShare(host_ram_limit(total_ram_bytes), fixed, max(1, sum(1 for v in offloads if v == "auto")))


def kv_offload_gib(
    memory: Memory, configured: float | Literal["auto", "off"], share: OffloadShare | None = None
) -> Decision[float | None]:
    """CPU memory for offloaded KV cache, GiB for the whole host (None: no offload).

    auto: the seed table's lower end by total RAM, capped by the available RAM and by this deployment's
    share of the host's offload RAM (whole GiB); off when less than 1 GiB is left.
    """
    if configured == "off":
        return Decision(None, "kv_offload = off in config")
    if not isinstance(configured, str):
        return Decision(float(configured), "set in config (kv_offload)")
    row = swap_row(memory.total_bytes)
    if row is None:
        return Decision(None, f"host RAM {gib(memory.total_bytes)}: below 32 GB no CPU KV offload is recommended")
    reason = f"recommended for {row.ram_gib} GB of RAM: {row.band} GiB; the lowest, {row.value_gib} GiB"
    value = row.value_gib
    if share is not None and share.each_gib < value:
        if share.each_gib < 1:
            return Decision(None, reason + f", but {share.describe()}: no offload")
        value = share.each_gib
        reason += f"; {share.describe()}"
    available = memory.available_bytes
    if available is None:
        return Decision(float(value), reason + " (available RAM unknown, not capped)")
    cap = math.floor(available / GIB)
    if cap < value:
        if cap < 1:
            return Decision(None, reason + f", but only {gib(available)} of RAM is available: no offload")
        return Decision(float(cap), reason + f", capped to the {gib(available)} of RAM available")
    return Decision(float(value), reason)


@dataclass(frozen=True)
class OffloadFlags:
    """How a KV offload amount is spelt for one vLLM release."""

    flags: tuple[tuple[str, str, str], ...]
    """(flag, value, reason) in argv order; empty when the release can do neither."""
    note: str | None = None


def kv_offload_flags(total_gib: float, tensor_parallel_size: int, caps: VllmCapabilities) -> OffloadFlags:
    """`--kv-offloading-size` (total over TP ranks) + `--kv-offloading-backend native`, else `--swap-space`.

    vLLM 0.12-0.17 accept both, but there `--swap-space` is only validated (vllm/config/cache.py)
    and the V1 engine never swaps; the KV offloading connector is what keeps KV in CPU RAM.
    """
    if caps.has("--kv-offloading-size") and caps.has("--kv-offloading-backend"):
        return OffloadFlags(
            (
                (
                    "--kv-offloading-size",
                    number(total_gib),
                    f"CPU KV-cache offload, GiB in total over the {tensor_parallel_size} TP rank(s)",
                ),
                ("--kv-offloading-backend", "native", "vLLM's own CPU offloading connector (no LMCache needed)"),
            )
        )
    if caps.has("--swap-space"):
        per_gpu = total_gib / tensor_parallel_size
        return OffloadFlags(
            (
                (
                    "--swap-space",
                    number(round(per_gpu, 2)),
                    f"vLLM {caps.version} has no --kv-offloading-size: CPU swap space per GPU "
                    f"({number(total_gib)} GiB over {tensor_parallel_size} GPU(s))",
                ),
            )
        )
    return OffloadFlags((), note=f"vLLM {caps.version} has neither --kv-offloading-size nor --swap-space")


# --------------------------------------------------------------------------- memory fit and TP


@dataclass(frozen=True)
class GpuFit:
    """Estimated memory on each GPU at one tensor-parallel size."""

    tensor_parallel_size: int
    budget: int
    """gpu_memory_utilization x the smallest GPU's memory."""
    weights: int
    """Weight bytes on each GPU (after any CPU offload)."""
    reserve: int
    kv_one_sequence: int
    """KV cache of one sequence of the planned context length (0 when unknown or not required)."""

    @property
    def needed(self) -> int:
        return self.weights + self.reserve + self.kv_one_sequence

    @property
    def fits(self) -> bool:
        return self.needed <= self.budget

    @property
    def kv_capacity(self) -> int:
        """Bytes left for the KV cache on each GPU."""
        return self.budget - self.weights - self.reserve

    def describe(self) -> str:
        kv = f" + KV for one sequence {gib(self.kv_one_sequence)}" if self.kv_one_sequence else ""
        return (
            f"weights {gib(self.weights)} + reserve {gib(self.reserve)}{kv} = {gib(self.needed)} per GPU "
            f"{'<=' if self.fits else '>'} budget {gib(self.budget)}"
        )


def gpu_fit(
    tensor_parallel_size: int,
    budget: int,
    weights_total: int,
    kv_one_sequence: int = 0,
    cpu_offload_bytes_per_gpu: int = 0,
) -> GpuFit:
    """Memory per GPU when the weights are split over `tensor_parallel_size` GPUs."""
    weights = max(0, math.ceil(weights_total / tensor_parallel_size) - cpu_offload_bytes_per_gpu)
    return GpuFit(tensor_parallel_size, budget, weights, RUNTIME_RESERVE_BYTES, kv_one_sequence)


def divides_heads(tensor_parallel_size: int, heads: int | None, kv_heads: int | None) -> bool:
    """vLLM's head split: TP divides the attention heads; KV heads divide by TP or TP by them.

    Sources: vllm/config/model.py verify_with_parallel_config ("Total number of attention heads
    (%d) must be divisible by tensor parallel size (%d)."), and QKVParallelLinear in
    vllm/model_executor/layers/linear.py for the KV heads.
    """
    if heads is not None and heads % tensor_parallel_size:
        return False
    if kv_heads is not None:
        if kv_heads >= tensor_parallel_size:
            return kv_heads % tensor_parallel_size == 0
        return tensor_parallel_size % kv_heads == 0
    return True


def tensor_parallel_size(
    gpu_count: int,
    budget: int,
    model: ModelFacts,
    configured: int | None,
    *,
    kv_one_sequence_at: Mapping[int, int] | None = None,
    cpu_offload_bytes_per_gpu: int = 0,
) -> Decision[int]:
    """`--tensor-parallel-size`: the config's value, else the fewest assigned GPUs that hold the
    weights plus the reserve (and one sequence's KV when a context length is set) and divide the heads.

    When nothing fits, the largest valid size is returned and `checks.check_weights_fit` reports it.
    """
    if configured is not None:
        return Decision(configured, "set in config (tensor_parallel_size)")
    heads, kv_heads = model.num_attention_heads, model.num_key_value_heads
    valid = [t for t in range(1, gpu_count + 1) if divides_heads(t, heads, kv_heads)]
    if model.parameter_bytes is None:
        powers = [t for t in valid if t & (t - 1) == 0] or valid or [1]
        return Decision(
            powers[-1],
            f"model size unknown: every assigned GPU that keeps a power-of-two split ({powers[-1]}); "
            "set tensor_parallel_size or model_facts.parameter_bytes",
        )
    kv = kv_one_sequence_at or {}
    for t in valid:
        fit = gpu_fit(t, budget, model.parameter_bytes, kv.get(t, 0), cpu_offload_bytes_per_gpu)
        if fit.fits:
            split = (
                "one GPU holds" if t == 1 else f"the fewest GPUs ({t} of {gpu_count}) that divide the heads and hold"
            )
            return Decision(t, f"{split} {gib(model.parameter_bytes)} of weights: {fit.describe()}")
    largest = valid[-1] if valid else 1
    return Decision(largest, f"no split of the {gpu_count} assigned GPU(s) holds the weights")


# --------------------------------------------------------------------------- context length


def largest_context(kv_capacity: int, kv_bytes_per_token: float) -> int:
    """The longest context whose KV cache fits, rounded down to vLLM's 16-token block."""
    if kv_capacity <= 0 or kv_bytes_per_token <= 0:
        return 0
    return int(kv_capacity // kv_bytes_per_token) // 16 * 16


def max_model_len(
    configured: int | Literal["auto"] | None,
    model: ModelFacts,
    *,
    kv_capacity: int | None,
    kv_bytes_per_token: float | None,
    supports_auto: bool,
) -> Decision[str | None]:
    """`--max-model-len`: the config's value; unset, the model's own length when its KV cache
    fits beside the weights, else `auto` (vLLM shrinks it; 0.14+) or the largest length that fits."""
    if configured == "auto":
        return Decision("auto", "set in config: vLLM picks the longest context that fits in memory")
    if configured is not None:
        return Decision(str(configured), "set in config (max_model_len)")
    native = model.max_position_embeddings
    if native is None or kv_capacity is None or kv_bytes_per_token is None:
        return Decision(None, "model default (its KV size is unknown, so not checked)")
    need = native * kv_bytes_per_token
    if need <= kv_capacity:
        return Decision(None, f"model default {native} tokens: its KV cache ({gib(need)}) fits in {gib(kv_capacity)}")
    why = (
        f"the model's {native}-token context needs {gib(need)} of KV cache per GPU, "
        f"more than the ~{gib(kv_capacity)} left"
    )
    if supports_auto:
        return Decision("auto", f"{why}: auto lets vLLM shrink it to what fits")
    return Decision(str(largest_context(kv_capacity, kv_bytes_per_token)), f"{why}: the largest length that fits")


def capacity(
    context: str | None,
    native: int | None,
    kv_capacity: int | None,
    kv_bytes_per_token: float | None,
    max_num_seqs: int | None,
) -> Capacity:
    """The context length and full-length concurrency the plan promises (vLLM's own arithmetic:
    `auto` takes the longest context that fits; concurrency = KV tokens / context)."""
    tokens = None
    if kv_capacity is not None and kv_bytes_per_token:
        tokens = max(0, int(kv_capacity // kv_bytes_per_token)) // 16 * 16
    if context == "auto":
        if tokens is None or native is None:
            length, note = None, "auto: vLLM takes the longest that fits"
        else:
            length = min(native, tokens)
            note = "the model's own" if length == native else f"auto: shrunk from the model's {native:,} to fit"
    elif context is not None:
        length = int(context)
        note = "as configured" if native is None or length <= native else f"beyond the model's own {native:,}"
    elif native is not None:
        length, note = native, "the model's own"
    else:
        length, note = None, "the model's own length, not known here (its config.json was not read)"
    concurrency = tokens / length if tokens is not None and length else None
    return Capacity(length, note, tokens, concurrency, max_num_seqs)


# --------------------------------------------------------------------------- KV-cache dtype


FP8_FAMILY = ("fp8", "fp8_e4m3", "fp8_e5m2")


def fp8_supported(compute_capability: tuple[int, int], attention_backend: str | None) -> tuple[bool, str]:
    """Whether an fp8 KV cache works with this GPU and backend, and why (FACTS.md, vLLM 0.33 backends).

    Triton needs SM 8.9+; FlashAttention SM 9.0 (FA3) or 10.0; FlashInfer SM 8.0-12.1. With no
    backend configured vLLM picks one; from SM 8.9 one that takes fp8 exists (Triton), below it
    only FlashInfer does, and the default there is FlashAttention 2: so unset means SM >= 8.9.
    """
    cc = tuple(compute_capability)
    sm = f"SM {cc[0]}.{cc[1]}"
    backend = (attention_backend or "").upper()
    if backend in ("", "AUTO"):
        ok = cc >= (8, 9)
        return ok, f"{sm} {'has' if ok else 'lacks'} an fp8-capable default attention backend (Triton from SM 8.9)"
    if backend in ("TRITON_ATTN", "TRITON"):
        return cc >= (8, 9), f"Triton attention takes an fp8 KV cache from SM 8.9 ({sm})"
    if backend in ("FLASH_ATTN", "FLASH_ATTENTION"):
        return cc in ((9, 0), (10, 0)), f"FlashAttention takes an fp8 KV cache on SM 9.0 (FA3) and 10.0 ({sm})"
    if backend == "FLASHINFER":
        return (8, 0) <= cc <= (12, 1), f"FlashInfer takes an fp8 KV cache on SM 8.0-12.1 ({sm})"
    return False, f"fp8 support of attention backend {attention_backend} is not known to dankserve"


def kv_cache_dtype(
    configured: str | None,
    compute_capability: tuple[int, int],
    attention_backend: str | None,
    caps: VllmCapabilities,
) -> Decision[str]:
    """`--kv-cache-dtype`: the config's value, else fp8 where the GPU and backend support it, else auto."""
    if configured is not None:
        return Decision(configured, "set in config (kv_cache_dtype)")
    ok, why = fp8_supported(compute_capability, attention_backend)
    if ok and "fp8" in caps.kv_cache_dtypes:
        return Decision("fp8", f"fp8 KV cache halves KV memory against bf16: {why}")
    return Decision("auto", f"the model's dtype: {why}")


# --------------------------------------------------------------------------- batching and speculation


# The seeds' examples: 8192 batched tokens ("higher values improve throughput", the FP8 example),
# 4096 ("lower values improve latency", the single-GPU example); 128 sequences (single-GPU
# example), 32 with speculative decoding or for latency (the DFlash example).
BATCHED_TOKENS = {"throughput": 8192, "latency": 4096}
SEQS_THROUGHPUT = 128
SEQS_FEW = 32
SPEC_TOKENS = {"throughput": 8, "latency": 16}


def max_num_batched_tokens(profile: Profile, configured: int | None) -> Decision[int]:
    """`--max-num-batched-tokens` from the profile (seeds: higher for throughput, lower for latency)."""
    if configured is not None:
        return Decision(configured, "set in config (max_num_batched_tokens)")
    value = BATCHED_TOKENS[profile]
    if profile == "throughput":
        return Decision(value, "throughput profile: 8192 (larger prefill chunks, more throughput)")
    return Decision(value, "latency profile: 4096 (smaller prefill chunks keep decode steps short)")


def max_num_seqs(profile: Profile, speculative: bool, configured: int | None) -> Decision[int]:
    """`--max-num-seqs`: 128 for throughput (seeds' single-GPU example), 32 for latency or with speculation."""
    if configured is not None:
        return Decision(configured, "set in config (max_num_seqs)")
    if speculative:
        return Decision(SEQS_FEW, "speculative decoding pays off at modest concurrency: 32 (as in the DFlash example)")
    if profile == "latency":
        return Decision(SEQS_FEW, "latency profile: 32, fewer concurrent sequences keep each one fast")
    return Decision(SEQS_THROUGHPUT, "throughput profile: 128 concurrent sequences (a single-GPU serving default)")


def speculative_config(spec: SpeculativeSettings, profile: Profile) -> Decision[str]:
    """`--speculative-config` as compact JSON with sorted keys (stable argv, stable compile-cache key)."""
    tokens = spec.tokens if spec.tokens is not None else SPEC_TOKENS[profile]
    payload: dict[str, str | int] = {"method": spec.method, "num_speculative_tokens": tokens}
    if spec.model is not None:
        payload["model"] = spec.model
    if spec.tokens is not None:
        why = "tokens set in config"
    elif profile == "throughput":
        why = "8 tokens per step for concurrent serving (the DFlash model card)"
    else:
        why = "16 tokens per step for a single user (the DFlash model card)"
    return Decision(json.dumps(payload, sort_keys=True, separators=(",", ":")), f"{spec.method}: {why}")


def cpu_offload(configured: CpuOffloadSettings | None) -> Decision[CpuOffloadSettings | None]:
    """Weights in CPU memory (UVA offload): only when configured; it costs much latency."""
    if configured is None:
        return Decision(None, "weights stay on the GPU (the default)")
    return Decision(configured, f"set in config: {number(configured.gib)} GiB of weights per GPU kept in CPU memory")


# --------------------------------------------------------------------------- NUMA


def numa_nodes_for(gpus: Sequence[Gpu]) -> tuple[int, ...] | None:
    """Each GPU's nearest NUMA node in order, or None when any is unknown."""
    nodes = [g.numa_node for g in gpus]
    if any(n is None or n < 0 for n in nodes):
        return None
    return tuple(n for n in nodes if n is not None)


def numa_binding(host: Host, gpus: Sequence[Gpu], configured: bool | None) -> Decision[tuple[int, ...] | None]:
    """Bind each GPU worker to its NUMA node when the host has several (seeds: NUMA optimisation).

    Value: None for no binding, () for `--numa-bind` alone (vLLM finds the nodes), else the node
    of each GPU for `--numa-bind-nodes`.
    """
    if configured is False:
        return Decision(None, "numa_bind = false in config")
    several = len(host.numa_nodes) > 1
    if not several and configured is None:
        return Decision(None, "one NUMA node: nothing to bind")
    nodes = numa_nodes_for(gpus)
    why = "set in config" if configured else f"{len(host.numa_nodes)} NUMA nodes"
    if nodes is None:
        return Decision((), f"{why}: pins each GPU worker to its nearest node (vLLM finds the nodes; NVML did not say)")
    return Decision(nodes, f"{why}: pins each GPU worker to the node nearest its GPU (one entry per GPU)")


# --------------------------------------------------------------------------- env and warnings


BASE_ENV = {
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "NO_COLOR": "1",
    "VLLM_DISABLE_LOG_LOGO": "1",
}


def outside_cache_root(vllm_cache_root: str) -> dict[str, str]:
    """Caches vLLM's boot fills that are not under VLLM_CACHE_ROOT by default, put there so a new container
    keeps them: Triton's kernels and autotuning results (TRITON_CACHE_DIR, default ~/.triton; vLLM's
    env_override turns on Triton's autotune cache, written there) and FlashInfer's JIT workspace
    (FLASHINFER_WORKSPACE_BASE, default ~: ~/.cache/flashinfer). Lost with each container, they are the
    likely cause of the slow first warm restart (FACTS.md; unverified on the GPU)."""
    return {
        "TRITON_CACHE_DIR": f"{vllm_cache_root}/triton",
        "FLASHINFER_WORKSPACE_BASE": f"{vllm_cache_root}/flashinfer",
    }


def container_env(vllm_cache_root: str, numa_bind: bool, extra: Mapping[str, str]) -> dict[str, str]:
    """vLLM's environment: a kept compile cache, NVML's GPU order, parseable logs, then the config's env."""
    env = {"VLLM_CACHE_ROOT": vllm_cache_root, **outside_cache_root(vllm_cache_root), **BASE_ENV}
    if numa_bind:
        env["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"  # vLLM's NUMA binding needs spawned workers
    env.update(extra)
    return env


def env_warnings(env: Mapping[str, str]) -> list[str]:
    """vLLM's own startup plan (VLLM_ENABLE_STARTUP_PLAN, 0.26+) beside dankserve's boot learning.

    dankserve's learned bytes win: vLLM applies its plan only when no --kv-cache-memory-bytes is given
    (vllm/v1/worker/startup_plan.py, maybe_apply_startup_plan). So the plan would act only on the boots
    dankserve lets vLLM profile, and turn them into boots that do not profile: dankserve would learn a
    plan's value (keyed without --gpu-memory-utilization; double-counted CUDA-graph memory in 0.27-0.33,
    vllm issue 57936) instead of a measurement."""
    if env.get("VLLM_ENABLE_STARTUP_PLAN", "0").strip() not in ("", "0"):
        return [
            "VLLM_ENABLE_STARTUP_PLAN is set: dankserve learns the KV size itself and passes it as "
            "--kv-cache-memory-bytes, which vLLM's plan never overrides; on the boots dankserve lets vLLM profile, "
            "vLLM's plan would be applied instead of a measurement (its key ignores --gpu-memory-utilization). "
            "Remove it from the deployment's env (docs/boot-learning.md)"
        ]
    return []


RECOMMENDED_PHYSICAL_CORES = 8


def host_warnings(host: Host, gpus: Sequence[Gpu]) -> tuple[str, ...]:
    """What the seeds advise against: fewer than 8 physical cores; MIG on an assigned GPU."""
    warnings: list[str] = []
    cores = host.cpu.physical_cores
    if cores < RECOMMENDED_PHYSICAL_CORES:
        warnings.append(
            f"{cores} physical CPU cores: {RECOMMENDED_PHYSICAL_CORES}+ are recommended "
            "(API server, engine core and one worker per GPU each want a core)"
        )
    mig = [g for g in gpus if g.mig_mode]
    if mig:
        names = ", ".join(f"GPU {g.index}" for g in mig)
        warnings.append(f"MIG is enabled on {names}: vLLM then sees MIG slices, and the memory plan assumes whole GPUs")
    return tuple(warnings)
