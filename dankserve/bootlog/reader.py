"""Boot-log reader: vLLM log lines in, boot facts and events out. Pure: no I/O, no clock.

Live use (the daemon, following a container's output)::

    reader = BootLogReader()
    for line in lines:
        for event in reader.feed(line):
            ...  # PhaseChanged, FailureDetected, StatsUpdated, BootStarted
    reader.facts  # BootFacts of the current (last) boot

Offline use: `read_boot_facts(lines)`, the facts of the last boot in the stream.

Speed: a line reaches a regex only when one of its whitespace-separated words is the token of
a pattern (one frozenset test), or it mentions an Error/Exception or `--kv-cache-memory`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from dankserve.bootlog.facts import (
    BootEvent,
    BootFacts,
    BootPhase,
    BootStarted,
    FailureClass,
    FailureDetected,
    PhaseChanged,
    StatsUpdated,
)
from dankserve.bootlog.lines import ANSI_RE, message_of, process_of, split_cri
from dankserve.bootlog.patterns import (
    ALL_PATTERNS,
    ARGS_BLOCK_SIZE_RE,
    ARGS_KV_RE,
    ARGS_MAX_LEN_RE,
    ARGV_KV_RE,
    EXCEPTION_CLASSES,
    EXCEPTION_RE,
    PYDANTIC_LOCATION_RE,
    RANK_OTHER,
    RANK_SPECIFIC,
    RANK_VALIDATION,
    VALUE_ERROR_DETAIL_RE,
    Kind,
    LinePattern,
)

Groups = tuple[str | None, ...]
Handler = Callable[[LinePattern, str, Groups], list[BootEvent]]
Search = Callable[[str], "re.Match[str] | None"]
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
class _Boot:
    """What one boot's lines said so far (mutable; frozen into BootFacts on demand)."""

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


class BootLogReader:
    """Reads one stream of vLLM output line by line; a later boot in the stream replaces the facts."""

    def __init__(self, patterns: tuple[LinePattern, ...] = ALL_PATTERNS) -> None:
        self._tokens = frozenset(pattern.token for pattern in patterns)
        self._token_order = {token: index for index, token in reversed(list(enumerate(p.token for p in patterns)))}
        self._boot = _Boot()
        self._partial: dict[str, str] = {}
        self._facts: BootFacts | None = None
        self.boots = 1
        """How many boots the stream has shown so far (the first is implicit)."""
        self._handlers: dict[Kind, Handler] = {
            Kind.VERSION: self._on_version,
            Kind.ENGINE_VERSION: self._on_engine_version,
            Kind.ARGS: self._on_args,
            Kind.LOAD_START: self._on_load_start,
            Kind.WEIGHTS_PROGRESS: self._on_weights_progress,
            Kind.WEIGHTS_DONE: self._on_weights_done,
            Kind.MODEL_LOADED: self._on_model_loaded,
            Kind.COMPILE_START: self._on_compile_start,
            Kind.COMPILE_HIT: self._on_compile_hit,
            Kind.COMPILE_MISS: self._on_compile_miss,
            Kind.COMPILE_TOTAL: self._on_compile_total,
            Kind.PROFILING: self._on_profiling,
            Kind.KV_AVAILABLE: self._on_kv_available,
            Kind.KV_GIVEN: self._on_kv_given,
            Kind.KV_SIZE: self._on_kv_size,
            Kind.KV_CONCURRENCY: self._on_kv_concurrency,
            Kind.KV_BLOCKS: self._on_kv_blocks,
            Kind.KV_SUGGESTION: self._on_kv_suggestion,
            Kind.CAPTURING: self._on_capturing,
            Kind.STATS: self._on_stats,
            Kind.PREEMPTED: self._on_preempted,
            Kind.READY: self._on_ready,
            Kind.FAILURE: self._on_failure,
        }
        groups: dict[str, list[tuple[Search, Handler, LinePattern, bool]]] = {}
        for pattern in patterns:
            step = (pattern.regex.search, self._handlers[pattern.kind], pattern, pattern.kind is Kind.FAILURE)
            groups.setdefault(pattern.token, []).append(step)
        self._groups = {token: tuple(steps) for token, steps in groups.items()}

    @property
    def facts(self) -> BootFacts:
        """The facts of the current (latest) boot."""
        if self._facts is None:
            self._facts = self._boot.freeze()
        return self._facts

    def feed(self, line: str) -> list[BootEvent]:
        """Read one line (with or without its newline); the events it causes, usually none."""
        if line.endswith("\n"):
            line = line[:-1]
        if self._partial or self._boot.await_detail or "\x1b" in line or "\r" in line or line.find(" P ", 20, 50) != -1:
            return self._feed_unusual(line)
        hits = self._tokens.intersection(line.split())
        if hits:
            return self._read_tokens(line, hits)
        return self._read_untokened(line)

    def _feed_unusual(self, line: str) -> list[BootEvent]:
        """Lines needing care first: CRI partial chunks, colours, \r, a pending error detail."""
        if self._partial or line.find(" P ", 20, 50) != -1:
            cri = split_cri(line)
            if cri is not None:  # rejoin a CRI line split into partial chunks
                stream, partial, content = cri
                joined = self._partial.pop(stream, "") + content
                if partial:
                    self._partial[stream] = joined
                    return []
                line = joined
        if "\x1b" in line:
            line = ANSI_RE.sub("", line)
        segments = line.split("\r") if "\r" in line else [line]
        events: list[BootEvent] = []
        for segment in segments:  # progress bars redraw with \r; vLLM ends continued lines with \r\n
            if segment.strip():
                events += self._read(segment)
        return events

    def _read(self, line: str) -> list[BootEvent]:
        boot = self._boot
        if boot.await_detail:
            boot.await_detail = False
            if line[:1].isspace():
                events = self._read_tokens(line, self._tokens.intersection(line.split()))
                if boot.failure_rank == RANK_VALIDATION:
                    self._validation_detail(line)
                return events
            if boot.failure_rank == RANK_VALIDATION and PYDANTIC_LOCATION_RE.match(line):
                self._validation_detail(line)  # a field error: its location, then the detail line
                boot.await_detail = True
                return []
        hits = self._tokens.intersection(line.split())
        if hits:
            return self._read_tokens(line, hits)
        return self._read_untokened(line)

    def _read_untokened(self, line: str) -> list[BootEvent]:
        if "Error" in line or "Exception" in line:
            return self._on_exception(line)
        if "--kv-cache-memory" in line:
            return self._on_argv_kv(line)
        return []

    def _read_tokens(self, line: str, hits: frozenset[str]) -> list[BootEvent]:
        # Per token, the first pattern that matches wins (its group's later ones are other
        # eras' wordings of the same line); tokens in table order.
        groups = self._groups
        order = (next(iter(hits)),) if len(hits) == 1 else sorted(hits, key=self._token_order.__getitem__)
        events: list[BootEvent] = []
        failure_matched = False
        for token in order:
            for search, handler, pattern, is_failure in groups[token]:
                match = search(line)
                if match is not None:
                    self._facts = None
                    failure_matched = failure_matched or is_failure
                    events += handler(pattern, line, match.groups())
                    break
        if not failure_matched and ("Error" in line or "Exception" in line):
            events += self._on_exception(line)
        if "--kv-cache-memory" in line:
            events += self._on_argv_kv(line)
        return events

    # --- boot boundaries ----------------------------------------------------------------------------

    def _new_boot(self) -> None:
        self._boot = _Boot()
        self._facts = None
        self.boots += 1

    def _on_version(self, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
        started = self._boot.progressed or self._boot.banner_seen
        if started:
            self._new_boot()
        self._boot.banner_seen = True
        self._boot.vllm_version = groups[0]
        return [BootStarted(vllm_version=groups[0])] if started else []

    def _weak_marker(self) -> list[BootEvent]:
        boot = self._boot
        if boot.phase is not None or boot.failure is not None or boot.ready:
            self._new_boot()
            return [BootStarted(vllm_version=None)]
        return []

    def _on_engine_version(self, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
        events = self._weak_marker()
        self._boot.vllm_version = self._boot.vllm_version or groups[0]
        return events

    def _on_args(self, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
        events = self._weak_marker()
        args = groups[0] or ""
        boot = self._boot
        if (found := ARGS_KV_RE.search(args)) is not None:
            boot.kv_given = int(found.group(1))
        if (found := ARGS_MAX_LEN_RE.search(args)) is not None:
            boot.max_model_len = int(found.group(1))
        if (found := ARGS_BLOCK_SIZE_RE.search(args)) is not None:
            boot.block_size = int(found.group(1))
        return events

    def _on_argv_kv(self, line: str) -> list[BootEvent]:
        found = ARGV_KV_RE.search(line)
        if found is not None and "Replace gpu_memory_utilization" not in line:
            value = parse_human_int(found.group(1))
            if value is not None:
                self._boot.kv_given = value
                self._facts = None
        return []

    # --- phases -------------------------------------------------------------------------------------

    def _advance(self, phase: BootPhase, weights_percent: int | None = None) -> list[BootEvent]:
        boot = self._boot
        boot.progressed = True
        if boot.phase is None or _PHASE_RANK[phase] > _PHASE_RANK[boot.phase]:
            boot.phase = phase
            if phase is BootPhase.LOADING:
                boot.weights_percent = weights_percent
            return [PhaseChanged(phase, weights_percent if phase is BootPhase.LOADING else None)]
        if (
            phase is BootPhase.LOADING
            and boot.phase is BootPhase.LOADING
            and weights_percent is not None
            and weights_percent != boot.weights_percent
        ):
            boot.weights_percent = weights_percent
            return [PhaseChanged(phase, weights_percent)]
        return []

    def _on_load_start(self, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
        return self._advance(BootPhase.LOADING, 0)

    def _on_weights_progress(self, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
        return self._advance(BootPhase.LOADING, min(100, int(groups[0] or 0)))

    def _on_weights_done(self, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
        return self._advance(BootPhase.LOADING, 100)

    def _on_model_loaded(self, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
        boot = self._boot
        seconds = float(groups[1] or 0)
        boot.model_load_seconds = seconds if boot.model_load_seconds is None else max(boot.model_load_seconds, seconds)
        return self._advance(BootPhase.LOADING, 100)

    def _on_compile_start(self, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
        return self._advance(BootPhase.COMPILING)

    def _on_compile_hit(self, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
        if self._boot.compile_hit is None:
            self._boot.compile_hit = True
        return self._advance(BootPhase.COMPILING)

    def _on_compile_miss(self, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
        self._boot.compile_hit = False  # one graph compiled: not a (full) cache hit
        return self._advance(BootPhase.COMPILING)

    def _on_compile_total(self, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
        tag, seconds = groups[0] or "", float(groups[1] or 0)
        self._boot.compile_totals[(process_of(line), tag)] = seconds
        return self._advance(BootPhase.PROFILING)

    def _on_profiling(self, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
        return self._advance(BootPhase.PROFILING)

    def _on_capturing(self, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
        return self._advance(BootPhase.CAPTURING)

    def _on_ready(self, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
        boot = self._boot
        boot.ready = True
        if boot.failure is FailureClass.OTHER:  # an exception the server survived
            boot.failure, boot.failure_rank, boot.failure_message = None, -1, None
        return self._advance(BootPhase.READY)

    # --- KV cache -----------------------------------------------------------------------------------

    def _on_kv_available(self, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
        self._boot.kv_gib = _min(self._boot.kv_gib, float(groups[0] or 0))
        return self._advance(BootPhase.PROFILING)

    def _on_kv_given(self, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
        return self._advance(BootPhase.PROFILING)

    def _on_kv_size(self, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
        boot = self._boot
        tokens = _int(groups[0] or "0")
        boot.kv_tokens = tokens if boot.kv_tokens is None else min(boot.kv_tokens, tokens)
        if len(groups) == 3 and groups[2] is not None:
            boot.max_model_len = _int(groups[1] or "0")
            boot.max_concurrency = _min(boot.max_concurrency, float(groups[2]))
        return self._advance(BootPhase.PROFILING)

    def _on_kv_concurrency(self, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
        boot = self._boot
        boot.max_model_len = _int(groups[0] or "0")
        boot.max_concurrency = _min(boot.max_concurrency, float(groups[1] or 0))
        return self._advance(BootPhase.PROFILING)

    def _on_kv_blocks(self, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
        blocks = int(groups[0] or 0)
        boot = self._boot
        boot.v0_blocks = blocks if boot.v0_blocks is None else min(boot.v0_blocks, blocks)
        return self._advance(BootPhase.PROFILING)

    def _on_kv_suggestion(self, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
        value = int(groups[0] or 0)
        boot = self._boot
        boot.kv_suggested = value if boot.kv_suggested is None else min(boot.kv_suggested, value)
        boot.progressed = True
        return []

    # --- serving stats ------------------------------------------------------------------------------

    def _on_stats(self, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
        boot = self._boot
        boot.kv_usage = round(float(groups[1] or 0) / 100.0, 4)
        if groups[0] is not None:
            boot.preemptions = int(groups[0])
        elif boot.preemptions is not None and "Waiting: " in line:
            boot.preemptions = 0  # V1 prints the interval's count only when it is not zero
        return [StatsUpdated(boot.kv_usage, boot.preemptions)]

    def _on_preempted(self, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
        boot = self._boot
        boot.preemptions = int(groups[0] or 0)
        return [StatsUpdated(boot.kv_usage, boot.preemptions)]

    # --- failures -----------------------------------------------------------------------------------

    def _report(self, failure: FailureClass, rank: int, message: str) -> list[BootEvent]:
        boot = self._boot
        boot.progressed = True
        if boot.ready and failure is FailureClass.OOM_LOAD:
            failure = FailureClass.ENGINE_DEAD  # out of memory while serving kills the engine
        if boot.ready and failure is FailureClass.OTHER:
            return []  # an exception logged while serving, the server still up
        if rank <= boot.failure_rank:
            return []
        boot.failure, boot.failure_rank = failure, rank
        detail = VALUE_ERROR_DETAIL_RE.match(message)
        boot.failure_message = (detail.group(1) if detail else message).strip()[:MAX_MESSAGE_CHARS]
        self._facts = None
        return [FailureDetected(failure, boot.failure_message, boot.estimated_max_model_len)]

    def _on_failure(self, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
        assert pattern.failure is not None
        if pattern.failure is FailureClass.MAX_LEN_TOO_LARGE and groups and groups[0] is not None:
            self._boot.estimated_max_model_len = int(groups[0])
        message = message_of(line)
        if pattern.failure is FailureClass.BAD_ARGUMENT and pattern.token == "error:" and groups[0]:
            message = groups[0]
        return self._report(pattern.failure, pattern.rank, message)

    def _on_exception(self, line: str) -> list[BootEvent]:
        match = EXCEPTION_RE.match(message_of(line))
        if match is None:
            return []
        self._facts = None
        known = EXCEPTION_CLASSES.get(match.group(2))
        if known is None:
            return self._report(FailureClass.OTHER, RANK_OTHER, match.group(0))
        events = self._report(known.failure, known.rank, match.group(0))
        if known.rank == RANK_VALIDATION and self._boot.failure_rank == RANK_VALIDATION:
            self._boot.await_detail = True
        return events

    def _validation_detail(self, line: str) -> None:
        detail = VALUE_ERROR_DETAIL_RE.match(line)
        boot = self._boot
        if detail is not None and boot.failure_message is not None:
            boot.failure_message = f"{boot.failure_message}: {detail.group(1).strip()}"[:MAX_MESSAGE_CHARS]
            self._facts = None


def read_boot_facts(lines: Iterable[str]) -> BootFacts:
    """The facts of the last boot in a stream of log lines."""
    reader = BootLogReader()
    for line in lines:
        reader.feed(line)
    return reader.facts


__all__ = ["RANK_SPECIFIC", "BootLogReader", "parse_human_int", "read_boot_facts"]
