"""Boot learning: remember a profiled boot's exact KV-cache bytes and reuse them safely. Pure.

After a boot that profiled its memory and became ready, vLLM's suggestion
(`--kv-cache-memory=<int>`, the bytes that fit the requested share) is kept together with the
free GPU memory NVML showed just before that boot, under a fingerprint of everything that
decides those bytes. A later boot with the same fingerprint passes `--kv-cache-memory-bytes`
(skipping vLLM's memory profiling, the slow and fragile part of a boot) only when every
assigned GPU has at least 99 % of the recorded free memory now: a pinned KV size with less
free memory would run out of memory mid-request. The first learned value is kept (the state
store's `LearnedKv` record is written once per fingerprint, `state.keep_first`): vLLM's
suggestion drifts a little between identical boots (FACTS.md), and chasing it would change
the compile cache key of older vLLM versions and gain nothing.

vLLM's own `VLLM_ENABLE_STARTUP_PLAN` (vllm PR 47388) does the same inside the container; it
is not used: dankserve needs the bytes and the reason outside vLLM (status, logs, the policy's
relearn after an OOM), for every vLLM version that has `--kv-cache-memory-bytes`, and keeps the
same free-memory guard.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from dankserve.bootlog.facts import BootFacts
from dankserve.host.model import GpuIdentity
from dankserve.plan.serve_args import spelled, split_options
from dankserve.state import LearnedKv

FREE_MEMORY_GUARD_PERCENT = 99
"""Reuse learned bytes only with at least this share of the recorded free memory on each GPU."""
FINGERPRINT_VERSION = 1


# argv flag (either spelling) -> MemoryFlags field; `store_true` switches are in _SWITCHES.
_FLAG_FIELDS: dict[str, str] = {
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--max-model-len": "max_model_len",
    "--kv-cache-dtype": "kv_cache_dtype",
    "--tensor-parallel-size": "tensor_parallel_size",
    "-tp": "tensor_parallel_size",
    "--pipeline-parallel-size": "pipeline_parallel_size",
    "-pp": "pipeline_parallel_size",
    "--max-num-seqs": "max_num_seqs",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--speculative-config": "speculative_config",
    "--spec-method": "spec_method",
    "--spec-model": "spec_model",
    "--spec-tokens": "spec_tokens",
    "--cpu-offload-gb": "cpu_offload_gb",
    "--cpu-offload-params": "cpu_offload_params",
    "--kv-offloading-size": "kv_offloading_size",
    "--kv-offloading-backend": "kv_offloading_backend",
    "--dtype": "dtype",
    "--quantization": "quantization",
    "-q": "quantization",
    "--block-size": "block_size",
    "--compilation-config": "compilation_config",
    "-O": "compilation_config",
    "--max-cudagraph-capture-size": "max_cudagraph_capture_size",
}
_SWITCHES: dict[str, tuple[str, bool]] = {
    "--enforce-eager": ("enforce_eager", True),
    "--no-enforce-eager": ("enforce_eager", False),
}


@dataclass(frozen=True)
class MemoryFlags:
    """The vLLM flags that change how much memory is left for the KV cache (values as argv strings).

    `--kv-cache-memory-bytes` is deliberately absent: it is what is learned, not an input.
    """

    gpu_memory_utilization: str | None = None
    max_model_len: str | None = None
    kv_cache_dtype: str | None = None
    tensor_parallel_size: str | None = None
    pipeline_parallel_size: str | None = None
    max_num_seqs: str | None = None
    max_num_batched_tokens: str | None = None
    enforce_eager: bool = False
    speculative_config: str | None = None
    spec_method: str | None = None
    spec_model: str | None = None
    spec_tokens: str | None = None
    cpu_offload_gb: str | None = None
    cpu_offload_params: str | None = None
    kv_offloading_size: str | None = None
    kv_offloading_backend: str | None = None
    dtype: str | None = None
    quantization: str | None = None
    block_size: str | None = None
    compilation_config: str | None = None
    max_cudagraph_capture_size: str | None = None

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> MemoryFlags:
        """The memory flags of a `vllm serve` argv (the last occurrence wins, as in argparse)."""
        values: dict[str, Any] = {}
        for option in split_options(argv)[1]:
            name = spelled(option.name)
            if name.startswith("-O") and len(name) > 2 and not name.startswith("--") and "=" not in option.tokens[0]:
                values["compilation_config"] = name[2:]  # argparse's attached short value: -O3
            elif name in _SWITCHES:
                key, value = _SWITCHES[name]
                values[key] = value
            elif name in _FLAG_FIELDS and option.values:
                values[_FLAG_FIELDS[name]] = option.values[0]
        return cls(**values)


def boot_fingerprint(
    *,
    vllm: str,
    model: str,
    revision: str | None,
    gpus: Sequence[GpuIdentity],
    flags: MemoryFlags,
) -> str:
    """A stable hash of what decides a boot's KV bytes.

    `vllm`: the image digest, or the vLLM version when there is no digest (process runtime).
    GPUs in assignment order. Live free memory is not part of it (that is the guard's job).
    """
    payload = {
        "v": FINGERPRINT_VERSION,
        "vllm": vllm,
        "model": model,
        "revision": revision,
        "gpus": [[gpu.name, gpu.memory_total_bytes] for gpu in gpus],
        "flags": asdict(flags),
    }
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return "kv1-" + hashlib.sha256(canonical.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class KvDecision:
    """Whether the next boot passes learned bytes (`use_bytes`) or profiles (None), and why."""

    use_bytes: int | None
    reason: str
    details: tuple[str, ...] = field(default_factory=tuple)
    """One line per GPU: free now against the baseline."""


def _gib(value: int) -> str:
    return f"{value / 2**30:.2f} GiB"


def decide_kv_reuse(learned: LearnedKv | None, free_bytes_now: Sequence[int]) -> KvDecision:
    """Reuse the learned bytes only when every assigned GPU has >= 99 % of the baseline free memory."""
    if learned is None:
        return KvDecision(None, "no KV size learned for this configuration yet: vLLM profiles memory")
    if len(free_bytes_now) != len(learned.baseline_free_bytes):
        return KvDecision(
            None,
            f"the KV size was learned on {len(learned.baseline_free_bytes)} GPU(s), {len(free_bytes_now)} assigned "
            "now: vLLM profiles memory",
        )
    details = []
    short = []
    for index, (now, baseline) in enumerate(zip(free_bytes_now, learned.baseline_free_bytes, strict=True)):
        ok = now * 100 >= baseline * FREE_MEMORY_GUARD_PERCENT
        details.append(f"GPU {index}: {_gib(now)} free now, {_gib(baseline)} when learned")
        if not ok:
            short.append(index)
    if short:
        worst = short[0]
        return KvDecision(
            None,
            f"GPU {worst} has {_gib(free_bytes_now[worst])} free, below {FREE_MEMORY_GUARD_PERCENT} % of the "
            f"{_gib(learned.baseline_free_bytes[worst])} free when the KV size was learned (another process holds "
            "memory?): vLLM profiles memory",
            tuple(details),
        )
    return KvDecision(
        learned.kv_cache_memory_bytes,
        f"reusing the learned KV size {learned.kv_cache_memory_bytes} bytes ({_gib(learned.kv_cache_memory_bytes)}): "
        f"free memory is at least {FREE_MEMORY_GUARD_PERCENT} % of the learned baseline on every GPU",
        tuple(details),
    )


def learn_from_boot(facts: BootFacts, baseline_free_bytes: Sequence[int], now: float) -> LearnedKv | None:
    """What to remember from a boot: only one that profiled its memory, became ready and did not fail."""
    if not (facts.ready and facts.profiled and facts.failure is None):
        return None
    if facts.kv_cache_memory_bytes is None or facts.kv_cache_memory_bytes <= 0 or not baseline_free_bytes:
        return None
    return LearnedKv(
        facts.kv_cache_memory_bytes, tuple(baseline_free_bytes), now, facts.vllm_version, facts.gpu_kv_cache_tokens
    )


KV_SHRINK_TOLERANCE_PERCENT = 1
"""A learned boot may hold this much less KV cache (tokens) than the profiled boot before it is reported."""


def kv_shrink_warning(learned: LearnedKv | None, tokens_now: int | None) -> str | None:
    """A message when a boot with learned bytes got a KV cache more than 1 % smaller (tokens) than the
    profiled boot it learned from (vLLM 0.27-0.33's suggested size double-counts CUDA-graph memory,
    vllm issue 57936), with the fix; None when it did not, or when either count is unknown."""
    if learned is None or learned.kv_cache_tokens is None or tokens_now is None:
        return None
    if tokens_now * 100 >= learned.kv_cache_tokens * (100 - KV_SHRINK_TOLERANCE_PERCENT):
        return None
    lost = 100 * (learned.kv_cache_tokens - tokens_now) / learned.kv_cache_tokens
    # KV bytes are proportional to tokens for one model and dtype: the size that holds the profiled count.
    wanted = -(-learned.kv_cache_memory_bytes * learned.kv_cache_tokens // tokens_now)
    return (
        f"the KV cache holds {tokens_now:,} tokens with the learned size, {lost:.1f} % fewer than the "
        f"{learned.kv_cache_tokens:,} of the profiled boot (vLLM 0.27-0.33's suggested size double-counts "
        f"CUDA-graph memory, vllm issue 57936): the profiled boot's tokens need {wanted} bytes, "
        f"{wanted - learned.kv_cache_memory_bytes} more; fix: use a vLLM release without that bug (0.26 is not "
        "affected), or raise gpu_memory_utilization by that much of a GPU's memory (a changed utilisation "
        "learns again)"
    )
