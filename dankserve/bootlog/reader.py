"""Boot-log reader: vLLM log lines in, boot facts and events out. Pure: no I/O, no clock.

Live use (the daemon, following a container's output)::

    reader = BootLogReader()
    for line in lines:
        for event in reader.feed(line):
            ...  # PhaseChanged, FailureDetected, StatsUpdated, BootStarted
    reader.facts  # BootFacts of the current (last) boot

Offline use: `read_boot_facts(lines)`, the facts of the last boot in the stream.

The reader owns the stream: CRI chunks rejoined, colours and `\r` redraws taken apart, which
pattern a line matches, and where a new boot begins; what each matched line means for the boot
is `boot_record`'s.

Speed: a line reaches a regex only when one of its whitespace-separated words is the token of
a pattern (one frozenset test), or it mentions an Error/Exception or `--kv-cache-memory`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from dankserve.bootlog.boot_record import (
    RECORDERS,
    BootRecord,
    Groups,
    Recorder,
    on_argv_kv,
    on_exception,
    parse_human_int,
)
from dankserve.bootlog.facts import (
    BootEvent,
    BootFacts,
    BootStarted,
)
from dankserve.bootlog.lines import ANSI_RE, split_cri
from dankserve.bootlog.patterns import (
    ALL_PATTERNS,
    ARGS_BLOCK_SIZE_RE,
    ARGS_KV_RE,
    ARGS_MAX_LEN_RE,
    PYDANTIC_LOCATION_RE,
    RANK_SPECIFIC,
    RANK_VALIDATION,
    Kind,
    LinePattern,
)

Search = Callable[[str], "re.Match[str] | None"]


class BootLogReader:
    """Reads one stream of vLLM output line by line; a later boot in the stream replaces the facts."""

    def __init__(self, patterns: tuple[LinePattern, ...] = ALL_PATTERNS) -> None:
        self._tokens = frozenset(pattern.token for pattern in patterns)
        self._token_order = {token: index for index, token in reversed(list(enumerate(p.token for p in patterns)))}
        self._boot = BootRecord()
        self._partial: dict[str, str] = {}
        self._facts: BootFacts | None = None
        self.boots = 1
        """How many boots the stream has shown so far (the first is implicit)."""
        self._handlers: dict[Kind, Recorder] = {
            **RECORDERS,
            Kind.VERSION: self._on_version,
            Kind.ENGINE_VERSION: self._on_engine_version,
            Kind.ARGS: self._on_args,
        }
        groups: dict[str, list[tuple[Search, Recorder, LinePattern, bool]]] = {}
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
                    boot.validation_detail(line)
                    self._facts = None
                return events
            if boot.failure_rank == RANK_VALIDATION and PYDANTIC_LOCATION_RE.match(line):
                boot.validation_detail(line)  # a field error: its location, then the detail line
                self._facts = None
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
                    events += handler(self._boot, pattern, line, match.groups())
                    break
        if not failure_matched and ("Error" in line or "Exception" in line):
            events += self._on_exception(line)
        if "--kv-cache-memory" in line:
            events += self._on_argv_kv(line)
        return events

    def _on_exception(self, line: str) -> list[BootEvent]:
        self._facts = None
        return on_exception(self._boot, line)

    def _on_argv_kv(self, line: str) -> list[BootEvent]:
        self._facts = None
        return on_argv_kv(self._boot, line)

    # --- boot boundaries ----------------------------------------------------------------------------

    def _new_boot(self) -> None:
        self._boot = BootRecord()
        self._facts = None
        self.boots += 1

    def _on_version(self, boot: BootRecord, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
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

    def _on_engine_version(self, boot: BootRecord, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
        events = self._weak_marker()
        self._boot.vllm_version = self._boot.vllm_version or groups[0]
        return events

    def _on_args(self, boot: BootRecord, pattern: LinePattern, line: str, groups: Groups) -> list[BootEvent]:
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


def read_boot_facts(lines: Iterable[str]) -> BootFacts:
    """The facts of the last boot in a stream of log lines."""
    reader = BootLogReader()
    for line in lines:
        reader.feed(line)
    return reader.facts


__all__ = ["RANK_SPECIFIC", "BootLogReader", "parse_human_int", "read_boot_facts"]
