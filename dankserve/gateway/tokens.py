"""How many tokens a request is expected to use and how many its answer used, read from what passes
through the gateway (pure, incremental).

A JSON answer carries `usage` (`prompt_tokens`, `completion_tokens`; Responses and Messages answers
`input_tokens`, `output_tokens`): read whole when it is at most
MAX_JSON_ANSWER, else found by a bounded scan as it passes (the last `"usage": {...}` object). A
streamed answer carries it in a last event with no choices: the gateway asks for it on every
stream of a route that has it (`stream_options.include_usage`, routing.py) and takes that event
out again where the client did not ask (`drop_usage`); `continuous_usage_stats` puts it in every
event, cumulative, so the last one counts. A stream that still has no usage (a route without
stream_options) is counted as one completion token per `data:` event that has a choice, and no
prompt tokens; `estimated` says the count is of this kind.

Before the answer, `estimate` gives the tokens a request is charged at admission (limits.py): its
body's size at BYTES_PER_TOKEN, plus what it allows the completion (`max_tokens` and its kin).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

MAX_JSON_ANSWER = 4 * 1024 * 1024
"""The largest JSON answer kept whole to read its usage (an embedding of a long batch can be MBs)."""
MAX_EVENT = 1024 * 1024
"""A streamed event longer than this is not read for usage (it is still passed on)."""
USAGE = b'"usage"'
USAGE_WINDOW = 4096
"""A `"usage"` object in a big answer is read from at most this many bytes after its name."""
BYTES_PER_TOKEN = 4
"""A request body's bytes per prompt token, for the estimate (English text runs about 4 a token; JSON's
syntax makes it an overestimate for chat, which the settlement gives back)."""
COMPLETION_GUESS = 1024
"""The completion tokens charged at admission to a generating request that sets no limit of its own."""
_COLON = re.compile(rb"\s*:\s*")


@dataclass(frozen=True)
class TokenCount:
    prompt: int = 0
    completion: int = 0
    estimated: bool = False

    @property
    def total(self) -> int:
        return self.prompt + self.completion


def estimate(body_bytes: int, max_tokens: int | None, generates: bool) -> int:
    """The tokens a request is charged when it is let in: its body's size in tokens and its completion's
    limit (COMPLETION_GUESS for a generating request without one; none for embeddings and the like)."""
    completion = max_tokens if max_tokens is not None else COMPLETION_GUESS if generates else 0
    return math.ceil(body_bytes / BYTES_PER_TOKEN) + completion


def _count(usage: object) -> TokenCount | None:
    """OpenAI's chat and completions name them prompt/completion; Responses and Anthropic's Messages input/output."""
    if not isinstance(usage, dict):
        return None
    prompt: object = usage.get("prompt_tokens", usage.get("input_tokens", 0))
    completion: object = usage.get("completion_tokens", usage.get("output_tokens", 0))
    if completion is None:
        completion = 0
    if not (isinstance(prompt, int) and isinstance(completion, int)) or isinstance(prompt, bool):
        return None
    if isinstance(completion, bool) or not (0 <= prompt < 1 << 40 and 0 <= completion < 1 << 40):
        return None
    return TokenCount(prompt, completion)


def _usage_of(document: bytes) -> TokenCount | None:
    """The usage of an answer or an event: at its top, or in the `response` of a Responses event
    (`response.completed`) or the `message` of a Messages one (`message_start`)."""
    try:
        parsed = json.loads(document)
    except (ValueError, RecursionError):
        return None
    if not isinstance(parsed, dict):
        return None
    for holder in (parsed, parsed.get("response"), parsed.get("message")):
        if isinstance(holder, dict) and "usage" in holder:
            return _count(holder["usage"])
    return None


def _later(before: TokenCount | None, found: TokenCount) -> TokenCount:
    """A stream's usage so far with a later event's: counts are cumulative, and an event may give only some
    (Messages: the input in `message_start`, the output in `message_delta`), so each is the larger seen."""
    if before is None:
        return found
    return TokenCount(max(before.prompt, found.prompt), max(before.completion, found.completion))


def _data(event: bytes) -> bytes | None:
    """An SSE event's data (its first `data:` line; Responses and Messages events begin with `event:`)."""
    if event.startswith(b"data: "):
        line = event[6:]
    else:
        at = event.find(b"\ndata: ")
        if at < 0:
            return None
        line = event[at + 7 :]
    return line.split(b"\n", 1)[0]


class _UsageScan:
    """The last `"usage": {...}` object of a byte stream, whatever its size, in bounded memory. Inside a JSON
    string a quote is escaped, so `"usage"` found in the bytes is a name (or the string "usage")."""

    def __init__(self) -> None:
        self._carry = b""
        self.found: TokenCount | None = None

    def feed(self, chunk: bytes, final: bool = False) -> None:
        data = self._carry + chunk if self._carry else chunk
        start = 0
        while True:
            at = data.find(USAGE, start)
            if at < 0:
                self._carry = data[max(start, len(data) - len(USAGE) + 1) :]
                return
            complete, count = self._object_after(data, at + len(USAGE))
            if not complete and not final and len(data) - at < USAGE_WINDOW:
                self._carry = data[at:]
                return
            if count is not None:
                self.found = count
            start = at + 1

    @staticmethod
    def _object_after(data: bytes, position: int) -> tuple[bool, TokenCount | None]:
        """Whether the bytes after a `"usage"` decide it, and its count when they hold a valid object."""
        colon = _COLON.match(data, position, position + USAGE_WINDOW)
        if colon is None:  # something other than a colon follows (a value "usage"), or nothing yet
            return bool(data[position : position + 64].strip()), None
        if colon.end() >= len(data):
            return False, None
        if data[colon.end() : colon.end() + 1] != b"{":
            return True, None
        text = data[colon.end() : colon.end() + USAGE_WINDOW].decode(errors="replace")
        try:
            value, _ = json.JSONDecoder().raw_decode(text)
        except (ValueError, RecursionError):
            return False, None
        return True, _count(value)


class AnswerTally:
    """Fed every chunk of one answer as it passes (`feed` returns what to pass on); `finish` at its end (what
    is left to pass on), then `count()`.

    `drop_usage`: the stream's usage-only event (no choices) is taken out: the gateway asked for it, the
    client did not. Then whole events are passed on as they complete; otherwise every chunk as it is."""

    def __init__(self, streamed: bool, drop_usage: bool = False) -> None:
        self._streamed = streamed
        self._drop_usage = streamed and drop_usage
        self._pending = b""
        self._events = 0
        self._usage: TokenCount | None = None
        self._kept: list[bytes] = []
        self._kept_bytes = 0
        self._scan = _UsageScan()
        self._finished = False
        self.ended = False
        """The stream's `data: [DONE]` passed: a client that leaves after it had its whole answer."""

    @property
    def streamed(self) -> bool:
        return self._streamed

    def feed(self, chunk: bytes) -> bytes:
        if not self._streamed:
            self._kept_bytes += len(chunk)
            if self._kept_bytes <= MAX_JSON_ANSWER:
                self._kept.append(chunk)
            else:
                self._kept = []
            self._scan.feed(chunk)
            return chunk
        data = self._pending + chunk if self._pending else chunk
        events = data.split(b"\n\n")
        self._pending = events.pop()
        passed: list[bytes] = []
        for event in events:
            if not self._event(event) or not self._drop_usage:
                passed.append(event + b"\n\n")
        if len(self._pending) > MAX_EVENT:  # not read for usage; its rest passes as a fragment of no event
            passed.append(self._pending)
            self._pending = b""
        return b"".join(passed) if self._drop_usage else chunk

    def _event(self, event: bytes) -> bool:
        """Count one event; True when it is the usage-only one (no choices)."""
        data = _data(event)
        if data == b"[DONE]":
            self.ended = True
            return False
        if data is None:
            return False
        found = _usage_of(data) if USAGE in data else None
        if found is not None:
            self._usage = _later(self._usage, found)
        if b'"choices":[]' not in event and b'"choices": []' not in event:
            self._events += 1
            return False
        return found is not None

    def finish(self) -> bytes:
        """The answer ended: what is still held back to pass on (an unfinished last event)."""
        if self._finished:
            return b""
        self._finished = True
        if not self._streamed:
            self._scan.feed(b"", final=True)
            return b""
        rest, self._pending = self._pending, b""
        if rest and self._event(rest.rstrip()) and self._drop_usage:
            return b""
        return rest if self._drop_usage else b""

    def count(self) -> TokenCount:
        self.finish()
        if not self._streamed:
            if self._kept_bytes > MAX_JSON_ANSWER:
                return self._scan.found or TokenCount(estimated=True)
            return _usage_of(b"".join(self._kept)) or TokenCount()
        if self._usage is not None:
            return self._usage
        return TokenCount(0, self._events, estimated=True)
