"""The last requests the gateway answered, for the console's Requests page (pure, bounded).

One entry per answered request, written where the request is counted (`Access.record`, when it ends):
when, the key's name, the model, the status code, the seconds it waited in the gateway's queue (for
its deployment to boot, wake or have room under its cap), to the first byte of the server's answer
and in all, and its tokens when it was passed on. Never its prompt, its answer or the key's value.
At most `RECENT_REQUESTS` entries are kept (the oldest go first); nothing is written to disk.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

from dankserve.gateway.tokens import TokenCount
from dankserve.gateway.usage import HIDDEN_KEYS, NO_LABEL

RECENT_REQUESTS = 200


@dataclass
class Stopwatch:
    """One request's times as the proxy sees them (monotonic seconds), filled in as it goes."""

    started: float
    queued_seconds: float = 0.0
    """Waited in the gateway's queue: its deployment booting, waking, or at its in-flight cap."""
    first_byte_at: float | None = None
    """When the first bytes of the server's answer came (None: the server never answered)."""


@dataclass(frozen=True)
class RecentRequest:
    at: float
    """Wall-clock seconds when it ended."""
    key: str
    model: str
    status: int
    queued_seconds: float | None
    first_byte_seconds: float | None
    total_seconds: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    tokens_estimated: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def recent_request(
    key: str, model: str, status: int, tokens: TokenCount, watch: Stopwatch | None, *, at: float, now: float
) -> RecentRequest:
    """The entry of a request that ended at monotonic `now` (wall `at`); `watch` None: refused before it was
    routed (no times, no tokens)."""
    if watch is None:
        return RecentRequest(at, key, model, status, None, None, None, None, None, False)
    first = None if watch.first_byte_at is None else round(watch.first_byte_at - watch.started, 4)
    return RecentRequest(
        at,
        key,
        model,
        status,
        round(watch.queued_seconds, 4),
        first,
        round(now - watch.started, 4),
        tokens.prompt,
        tokens.completion,
        tokens.estimated,
    )


class RecentRequests:
    """The last RECENT_REQUESTS entries (not thread-safe: `Access` holds its lock around it)."""

    def __init__(self, size: int = RECENT_REQUESTS) -> None:
        self._entries: deque[RecentRequest] = deque(maxlen=size)

    def add(self, entry: RecentRequest) -> None:
        self._entries.append(entry)

    def newest_first(self) -> list[RecentRequest]:
        return list(reversed(self._entries))


def hide_request_keys(entries: Iterable[RecentRequest]) -> list[RecentRequest]:
    """The entries with every key's name as HIDDEN_KEYS (`-`, no key, stays): what a viewer without the
    `console:admin` scope is shown, as /metrics without its key folds them (`usage.hide_key_names`)."""
    return [e if e.key == NO_LABEL else replace(e, key=HIDDEN_KEYS) for e in entries]


async def first_byte_timed(
    chunks: AsyncIterator[bytes], watch: Stopwatch, clock: Callable[[], float]
) -> AsyncIterator[bytes]:
    """The server's answer as it comes, noting in `watch` when its first bytes came."""
    async for chunk in chunks:
        if watch.first_byte_at is None:
            watch.first_byte_at = clock()
        yield chunk
