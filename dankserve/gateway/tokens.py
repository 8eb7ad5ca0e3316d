"""How many tokens an answer used, read from what passes through the gateway (pure, incremental).

A JSON answer carries `usage` (`prompt_tokens`, `completion_tokens`). A streamed one carries it only
when the client asked (`stream_options: {"include_usage": true}`: a last event with no choices and
the usage; `continuous_usage_stats`: every event, cumulative, so the last one counts). A stream
without usage is counted as one completion token per `data:` event that has a choice, and no
prompt tokens: vLLM sends one event per engine step, a token each unless speculative decoding
adds more, so this undercounts such streams; `estimated` says the count is of this kind.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

MAX_JSON_ANSWER = 4 * 1024 * 1024
"""The largest JSON answer kept to read its usage (an embedding of a long batch can be MBs)."""
MAX_EVENT = 1024 * 1024
"""A streamed event longer than this is not read for usage (it is still passed on)."""
USAGE = b'"usage"'


@dataclass(frozen=True)
class TokenCount:
    prompt: int = 0
    completion: int = 0
    estimated: bool = False

    @property
    def total(self) -> int:
        return self.prompt + self.completion


def _count(usage: object) -> TokenCount | None:
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 40 for v in (prompt, completion)):
        return None
    return TokenCount(prompt, completion or 0)


def _usage_of(document: bytes) -> TokenCount | None:
    try:
        parsed = json.loads(document)
    except (ValueError, RecursionError):
        return None
    return _count(parsed.get("usage")) if isinstance(parsed, dict) else None


class AnswerTally:
    """Fed every chunk of one answer as it passes; `count()` once it ended."""

    def __init__(self, streamed: bool) -> None:
        self._streamed = streamed
        self._pending = b""
        self._events = 0
        self._usage: TokenCount | None = None
        self._kept: list[bytes] = []
        self._kept_bytes = 0

    def feed(self, chunk: bytes) -> None:
        if not self._streamed:
            self._kept_bytes += len(chunk)
            if self._kept_bytes <= MAX_JSON_ANSWER:
                self._kept.append(chunk)
            return
        data = self._pending + chunk if self._pending else chunk
        events = data.split(b"\n\n")
        self._pending = events.pop()
        if len(self._pending) > MAX_EVENT:
            self._pending = b""
        for event in events:
            self._event(event)

    def _event(self, event: bytes) -> None:
        if not event.startswith(b"data: ") or event == b"data: [DONE]":
            return
        if USAGE in event:
            found = _usage_of(event[6:])
            if found is not None:
                self._usage = found
        if b'"choices":[]' not in event and b'"choices": []' not in event:
            self._events += 1

    def count(self) -> TokenCount:
        if not self._streamed:
            if self._kept_bytes > MAX_JSON_ANSWER:
                return TokenCount(estimated=True)
            return _usage_of(b"".join(self._kept)) or TokenCount()
        if self._pending:
            self._event(self._pending.rstrip())
            self._pending = b""
        if self._usage is not None:
            return self._usage
        return TokenCount(0, self._events, estimated=True)
