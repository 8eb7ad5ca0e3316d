"""What a vLLM boot log tells: the facts of one boot, and the events a live reader emits.

Plain frozen data; the parser that fills it lives in `reader.py`, the line shapes in
`patterns.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class FailureClass(StrEnum):
    """Why a boot failed, as far as its log says. The failure policy maps each to an action."""

    OOM_LOAD = "oom_load"
    """Not enough GPU memory to load the weights (or to reserve the requested share)."""
    NO_KV_MEMORY = "no_kv_memory"
    """Weights and activations left no memory for the KV cache."""
    MAX_LEN_TOO_LARGE = "max_len_too_large"
    """The KV cache cannot hold one request of max_model_len tokens."""
    BAD_ARGUMENT = "bad_argument"
    """vLLM rejected a flag or a configuration value."""
    MODEL_NOT_FOUND = "model_not_found"
    """The model (or revision) does not exist, is gated without a token, or is not in the offline cache."""
    ENGINE_DEAD = "engine_dead"
    """The engine core died (at start without a known root cause, or while serving)."""
    OTHER = "other"
    """An uncaught exception of no known class."""


class BootPhase(StrEnum):
    """Boot phases the log reveals, in the order a boot passes them."""

    LOADING = "loading"
    COMPILING = "compiling"
    PROFILING = "profiling"
    CAPTURING = "capturing"
    READY = "ready"

    @property
    def rank(self) -> int:
        """Position in boot order (phases only move forward within a boot)."""
        return _PHASE_ORDER[self]


_PHASE_ORDER = {phase: i for i, phase in enumerate(BootPhase)}

KvBytesSource = str
"""`suggested` (vLLM's `--kv-cache-memory=<int>` after profiling) or `given` (the boot's own flag)."""


@dataclass(frozen=True)
class BootFacts:
    """The facts of one vLLM boot. `to_json()` gives the `dankserve inspect-log --json` form."""

    vllm_version: str | None = None
    kv_cache_memory_bytes: int | None = None
    """Exact bytes per GPU: vLLM's suggestion (smallest over ranks) or the value the boot was given."""
    kv_cache_gib: float | None = None
    """`Available KV cache memory` (GiB, smallest over ranks); None when profiling was skipped."""
    gpu_kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    compile_cache_hit: bool | None = None
    """True: compiled graphs loaded from the cache; False: something was compiled; None: no compile seen."""
    compile_seconds: float | None = None
    """`torch.compile took ... in total`: summed over compile tags of a process, largest over processes."""
    model_load_seconds: float | None = None
    ready: bool = False
    """The server logged `Application startup complete.`"""
    failure: FailureClass | None = None
    failure_message: str | None = None
    estimated_max_model_len: int | None = None
    preemptions: int | None = None
    """Latest preemption count printed: per 10-s interval on V1 (0 after a stats line without it),
    cumulative on V0; None if never printed."""
    kv_cache_usage_perc: float | None = None
    """Latest KV-cache usage as a fraction 0..1 (like the `vllm:kv_cache_usage_perc` metric)."""
    # Not part of the JSON form; what the supervisor needs besides.
    phase: BootPhase | None = None
    weights_percent: int | None = None
    kv_cache_memory_bytes_source: KvBytesSource | None = None
    max_model_len: int | None = None
    """The boot's max_model_len as its log tells (args or the concurrency line)."""

    @property
    def profiled(self) -> bool:
        """The boot measured its KV size itself (so its suggestion may be learned)."""
        return self.kv_cache_memory_bytes_source == "suggested"

    def to_json(self) -> dict[str, Any]:
        """The JSON keys of `dankserve inspect-log --json`, in the documented order."""
        return {
            "vllm_version": self.vllm_version,
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "kv_cache_gib": self.kv_cache_gib,
            "gpu_kv_cache_tokens": self.gpu_kv_cache_tokens,
            "max_concurrency": self.max_concurrency,
            "compile_cache_hit": self.compile_cache_hit,
            "compile_seconds": self.compile_seconds,
            "model_load_seconds": self.model_load_seconds,
            "ready": self.ready,
            "failure": None if self.failure is None else self.failure.value,
            "failure_message": self.failure_message,
            "estimated_max_model_len": self.estimated_max_model_len,
            "preemptions": self.preemptions,
            "kv_cache_usage_perc": self.kv_cache_usage_perc,
        }


@dataclass(frozen=True)
class BootStarted:
    """A new boot began in the same stream: the facts so far belonged to an earlier boot."""

    vllm_version: str | None


@dataclass(frozen=True)
class PhaseChanged:
    """The boot reached a later phase, or (while loading) a new weights percentage."""

    phase: BootPhase
    weights_percent: int | None = None


@dataclass(frozen=True)
class FailureDetected:
    """The log names a failure (or a more specific cause than the one reported before)."""

    failure: FailureClass
    message: str
    estimated_max_model_len: int | None = None


@dataclass(frozen=True)
class StatsUpdated:
    """A periodic stats line: KV-cache usage (fraction) and, when printed, preemptions."""

    kv_cache_usage_perc: float | None
    preemptions: int | None


BootEvent = BootStarted | PhaseChanged | FailureDetected | StatsUpdated
