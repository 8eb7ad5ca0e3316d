"""One boot as its log lines tell it: the record a `BootLogReader` fills, and what each kind of line means for it.

Pure: each `on_KIND(boot, pattern, line, groups)` updates the record from one matched line and
returns the events it causes; `RECORDERS` maps the pattern kinds to them. The reader keeps what
concerns the stream (chunks, colours, which pattern a line matches, where a boot begins).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dankserve.bootlog.facts import (
    BootEvent,
    BootFacts,
    BootPhase,
    FailureClass,
    FailureDetected,
    PhaseChanged,
    StatsUpdated,
)
from dankserve.bootlog.lines import message_of, process_of
from dankserve.bootlog.patterns import (
    ARGV_KV_RE,
    EXCEPTION_CLASSES,
    EXCEPTION_RE,
    RANK_OTHER,
    RANK_VALIDATION,
    VALUE_ERROR_DETAIL_RE,
    Kind,
    LinePattern,
)

Groups = tuple[str | None, ...]
Recorder = Callable[["BootRecord", LinePattern, str, Groups], list[BootEvent]]
_PHASE_RANK = {phase: phase.rank for phase in BootPhase}
V0_DEFAULT_BLOCK_SIZE = 16
"""V0's CUDA default `--block-size`: its log gives GPU blocks, not tokens."""
MAX_MESSAGE_CHARS = 2000

_HUMAN_MULTIPLIERS = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_human_int(text: str) -> int | None:
    """An integer as vLLM's `human_readable_int` reads it (`20G` = 20 GiB, `20g` = 20e9), else None."""
    suffix = text[-1:]
    try:
        if suffix in _HUMAN_MULTIPLIERS:
            return int(float(text[:-1]) * _HUMAN_MULTIPLIERS[suffix])
        return int(text)
    except ValueError:
        return None


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _min(current: float | None, new: float) -> float:
    return new if current is None or new < current else current


@dataclass
class BootRecord:
    """What one boot's lines said so far (mutable; frozen into BootFacts on demand), and what a line means for it."""

    vllm_version: str | None = None
    banner_seen: bool = False
    progressed: bool = False
    kv_suggested: int | None = None
    kv_given: int | None = None
    kv_gib: float | None = None
    kv_tokens: int | None = None
    v0_blocks: int | None = None
    block_size: int | None = None
    max_concurrency: float | None = None
    max_model_len: int | None = None
    compile_hit: bool | None = None
    compile_totals: dict[tuple[str, str], float] = field(default_factory=dict)
    model_load_seconds: float | None = None
    ready: bool = False
    failure: FailureClass | None = None
    failure_rank: int = -1
    failure_message: str | None = None
    estimated_max_model_len: int | None = None
    await_detail: bool = False
    preemptions: int | None = None
    kv_usage: float | None = None
    phase: BootPhase | None = None
    weights_percent: int | None = None

    def freeze(self) -> BootFacts:
        tokens = self.kv_tokens
        if tokens is None and self.v0_blocks is not None:
            tokens = self.v0_blocks * (self.block_size or V0_DEFAULT_BLOCK_SIZE)
        compile_seconds: float | None = None
        if self.compile_totals:
            per_process: dict[str, float] = {}
            for (process, _tag), seconds in self.compile_totals.items():
                per_process[process] = per_process.get(process, 0.0) + seconds
            compile_seconds = round(max(per_process.values()), 3)
        if self.kv_suggested is not None:
            kv_bytes, source = self.kv_suggested, "suggested"
        elif self.kv_given is not None:
            kv_bytes, source = self.kv_given, "given"
        else:
            kv_bytes, source = None, None
        return BootFacts(
            vllm_version=self.vllm_version,
            kv_cache_memory_bytes=kv_bytes,
            kv_cache_gib=self.kv_gib,
            gpu_kv_cache_tokens=tokens,
            max_concurrency=self.max_concurrency,
            compile_cache_hit=self.compile_hit,
            compile_seconds=compile_seconds,
            model_load_seconds=self.model_load_seconds,
            ready=self.ready,
            failure=self.failure,
            failure_message=self.failure_message,
            estimated_max_model_len=self.estimated_max_model_len,
            preemptions=self.preemptions,
            kv_cache_usage_perc=self.kv_usage,
            phase=self.phase,
            weights_percent=self.weights_percent,
            kv_cache_memory_bytes_source=source,
            max_model_len=self.max_model_len,
        )

    def advance(self, phase: BootPhase, weights_percent: int | None = None) -> list[BootEvent]:
        self.progressed = True
        if self.phase is None or _PHASE_RANK[phase] > _PHASE_RANK[self.phase]:
            self.phase = phase
            if phase is BootPhase.LOADING:
                self.weights_percent = weights_percent
            return [PhaseChanged(phase, weights_percent if phase is BootPhase.LOADING else None)]
        if (
            phase is BootPhase.LOADING
            and self.phase is BootPhase.LOADING
            and weights_percent is not None
            and weights_percent != self.weights_percent
        ):
            self.weights_percent = weights_percent
            return [PhaseChanged(phase, weights_percent)]
        return []

    def report(self, failure: FailureClass, rank: int, message: str) -> list[BootEvent]:
        self.progressed = True
        if self.ready and failure is FailureClass.OOM_LOAD:
            failure = FailureClass.ENGINE_DEAD  # out of memory while serving kills the engine
        if self.ready and failure is FailureClass.OTHER:
            return []  # an exception logged while serving, the server still up
        if rank <= self.failure_rank:
            return []
        self.failure, self.failure_rank = failure, rank
        detail = VALUE_ERROR_DETAIL_RE.match(message)
        self.failure_message = (detail.group(1) if detail else message).strip()[:MAX_MESSAGE_CHARS]
        return [FailureDetected(failure, self.failure_message, self.estimated_max_model_len)]

    def validation_detail(self, line: str) -> None:
        detail = VALUE_ERROR_DETAIL_RE.match(line)
        if detail is not None and self.failure_message is not None:
            self.failure_message = f"{self.failure_message}: {detail.group(1).strip()}"[:MAX_MESSAGE_CHARS]


def on_load_start(boot: BootRecord, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
    return boot.advance(BootPhase.LOADING, 0)


def on_weights_progress(boot: BootRecord, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
    return boot.advance(BootPhase.LOADING, min(100, int(groups[0] or 0)))


def on_weights_done(boot: BootRecord, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
    return boot.advance(BootPhase.LOADING, 100)


def on_model_loaded(boot: BootRecord, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
    seconds = float(groups[1] or 0)
    boot.model_load_seconds = seconds if boot.model_load_seconds is None else max(boot.model_load_seconds, seconds)
    return boot.advance(BootPhase.LOADING, 100)


def on_compile_start(boot: BootRecord, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
    return boot.advance(BootPhase.COMPILING)


def on_compile_hit(boot: BootRecord, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
    if boot.compile_hit is None:
        boot.compile_hit = True
    return boot.advance(BootPhase.COMPILING)


def on_compile_miss(boot: BootRecord, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
    boot.compile_hit = False  # one graph compiled: not a (full) cache hit
    return boot.advance(BootPhase.COMPILING)


def on_compile_total(boot: BootRecord, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
    tag, seconds = groups[0] or "", float(groups[1] or 0)
    boot.compile_totals[(process_of(line), tag)] = seconds
    return boot.advance(BootPhase.PROFILING)


def on_profiling(boot: BootRecord, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
    return boot.advance(BootPhase.PROFILING)


def on_capturing(boot: BootRecord, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
    return boot.advance(BootPhase.CAPTURING)


def on_ready(boot: BootRecord, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
    boot.ready = True
    if boot.failure is FailureClass.OTHER:  # an exception the server survived
        boot.failure, boot.failure_rank, boot.failure_message = None, -1, None
    return boot.advance(BootPhase.READY)


def on_kv_available(boot: BootRecord, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
    boot.kv_gib = _min(boot.kv_gib, float(groups[0] or 0))
    return boot.advance(BootPhase.PROFILING)


def on_kv_given(boot: BootRecord, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
    return boot.advance(BootPhase.PROFILING)


def on_kv_size(boot: BootRecord, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
    tokens = _int(groups[0] or "0")
    boot.kv_tokens = tokens if boot.kv_tokens is None else min(boot.kv_tokens, tokens)
    if len(groups) == 3 and groups[2] is not None:
        boot.max_model_len = _int(groups[1] or "0")
        boot.max_concurrency = _min(boot.max_concurrency, float(groups[2]))
    return boot.advance(BootPhase.PROFILING)


def on_kv_concurrency(boot: BootRecord, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
    boot.max_model_len = _int(groups[0] or "0")
    boot.max_concurrency = _min(boot.max_concurrency, float(groups[1] or 0))
    return boot.advance(BootPhase.PROFILING)


def on_kv_blocks(boot: BootRecord, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
    blocks = int(groups[0] or 0)
    boot.v0_blocks = blocks if boot.v0_blocks is None else min(boot.v0_blocks, blocks)
    return boot.advance(BootPhase.PROFILING)


def on_kv_suggestion(boot: BootRecord, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
    value = int(groups[0] or 0)
    boot.kv_suggested = value if boot.kv_suggested is None else min(boot.kv_suggested, value)
    boot.progressed = True
    return []


def on_stats(boot: BootRecord, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
    boot.kv_usage = round(float(groups[1] or 0) / 100.0, 4)
    if groups[0] is not None:
        boot.preemptions = int(groups[0])
    elif boot.preemptions is not None and "Waiting: " in line:
        boot.preemptions = 0  # V1 prints the interval's count only when it is not zero
    return [StatsUpdated(boot.kv_usage, boot.preemptions)]


def on_preempted(boot: BootRecord, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
    boot.preemptions = int(groups[0] or 0)
    return [StatsUpdated(boot.kv_usage, boot.preemptions)]


def on_failure(boot: BootRecord, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
    assert pattern.failure is not None
    if pattern.failure is FailureClass.MAX_LEN_TOO_LARGE and groups and groups[0] is not None:
        boot.estimated_max_model_len = int(groups[0])
    message = message_of(line)
    if pattern.failure is FailureClass.BAD_ARGUMENT and pattern.token == "error:" and groups[0]:
        message = groups[0]
    return boot.report(pattern.failure, pattern.rank, message)


def on_exception(boot: BootRecord, line: str) -> list[BootEvent]:
    match = EXCEPTION_RE.match(message_of(line))
    if match is None:
        return []
    known = EXCEPTION_CLASSES.get(match.group(2))
    if known is None:
        return boot.report(FailureClass.OTHER, RANK_OTHER, match.group(0))
    events = boot.report(known.failure, known.rank, match.group(0))
    if known.rank == RANK_VALIDATION and boot.failure_rank == RANK_VALIDATION:
        boot.await_detail = True
    return events


def on_argv_kv(boot: BootRecord, line: str) -> list[BootEvent]:
    found = ARGV_KV_RE.search(line)
    if found is not None and "Replace gpu_memory_utilization" not in line:
        value = parse_human_int(found.group(1))
        if value is not None:
            boot.kv_given = value
    return []


RECORDERS: dict[Kind, Recorder] = {
    Kind.LOAD_START: on_load_start,
    Kind.WEIGHTS_PROGRESS: on_weights_progress,
    Kind.WEIGHTS_DONE: on_weights_done,
    Kind.MODEL_LOADED: on_model_loaded,
    Kind.COMPILE_START: on_compile_start,
    Kind.COMPILE_HIT: on_compile_hit,
    Kind.COMPILE_MISS: on_compile_miss,
    Kind.COMPILE_TOTAL: on_compile_total,
    Kind.PROFILING: on_profiling,
    Kind.KV_AVAILABLE: on_kv_available,
    Kind.KV_GIVEN: on_kv_given,
    Kind.KV_SIZE: on_kv_size,
    Kind.KV_CONCURRENCY: on_kv_concurrency,
    Kind.KV_BLOCKS: on_kv_blocks,
    Kind.KV_SUGGESTION: on_kv_suggestion,
    Kind.CAPTURING: on_capturing,
    Kind.STATS: on_stats,
    Kind.PREEMPTED: on_preempted,
    Kind.READY: on_ready,
    Kind.FAILURE: on_failure,
}
"""What each kind of line means for the boot (the reader handles the kinds that begin one: VERSION,
ENGINE_VERSION, ARGS)."""
