"""Who may use the gateway and how much (the shell around keys.py, limits.py and usage.py).

The key set is read at start and again by every reload, before the reload is accepted
(`prepare_reload`): a key set that cannot be read refuses the reload, which says why, so a reload
that reports success has put the files' keys in force (a removed key is refused from then on). A
request in flight keeps the key it was let in with.
The usage counters and the last requests (`recent_requests`) are kept in memory under a lock (the gateway's
loop writes, /metrics reads from another thread); the counters are written to the state dir every
`SAVE_SECONDS` when they changed, and at close (the last requests are not written).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from dankserve.gateway.keys import API, Key, KeyRing, bearer
from dankserve.gateway.keys_dir import read_keys
from dankserve.gateway.limits import KeyLimits, Refusal
from dankserve.gateway.recent_requests import RecentRequest, RecentRequests, Stopwatch, recent_request
from dankserve.gateway.tokens import TokenCount
from dankserve.gateway.usage import NO_LABEL, Counts, Label, Usage
from dankserve.gateway.usage_store import load_usage, write_usage
from dankserve.settings import GatewaySettings

log = structlog.get_logger("dankserve.gateway")

SAVE_SECONDS = 10.0
"""At most this much counting is lost to a crash (kill -9); a clean stop writes all."""
ANONYMOUS = Key(NO_LABEL, "-" * 16)
"""The key of requests to a gateway that asks for none (counted under `-`)."""


@dataclass(frozen=True)
class Denied:
    """A request refused before it is routed: its status and message (401)."""

    status: int
    message: str


class Access:
    """Keys (read again by each reload), per-key limits, usage counters."""

    def __init__(
        self,
        settings: GatewaySettings,
        usage_file: Path | None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._ring = read_keys(settings.keys_dir, settings.api_key_file)  # at start a bad key set stops the daemon
        self.limits = KeyLimits()
        self._clock, self._wall = clock, wall
        self._usage_file = usage_file
        self._usage = load_usage(usage_file) if usage_file is not None else Usage()
        self._recent = RecentRequests()
        self._lock = threading.Lock()

    def ring(self) -> KeyRing:
        return self._ring

    def prepare_reload(self, settings: GatewaySettings) -> Callable[[], None]:
        """Read the key set `settings` names now; the function that puts it in force once the reload is
        accepted. Raises ConfigError (the reload is refused, and says why) when it cannot be read."""
        ring = read_keys(settings.keys_dir, settings.api_key_file)

        def use() -> None:
            if ring != self._ring:
                log.info("gateway_keys_read", keys=[k.name for k in ring.keys])
            self._ring = ring  # one reference swap: a request reads the old set or the new one, never half
            self.limits.forget_others({k.name for k in ring.keys})

        return use

    def identify(self, authorization: list[str], scope: str = API) -> Key | Denied:
        """The request's key by its Authorization header(s): exactly one `Bearer KEY` of a configured key
        that holds `scope` (403 for a known key without it: a console-only key does not reach the models)."""
        ring = self.ring()
        if not ring.required:
            return ANONYMOUS
        token = bearer(authorization)
        if token is None:
            found = None
            message = "missing API key: send one `Authorization: Bearer KEY` header"
        else:
            found = ring.identify(token)
            message = "incorrect API key provided"
        if found is None:
            return Denied(401, message)
        if not found.may(scope):
            return Denied(403, f"the key {found.name!r} lacks the scope {scope!r}; add it to the key file's scopes")
        return found

    def admit(self, key: Key) -> Refusal | None:
        if key is ANONYMOUS:
            return None
        return self.limits.admit(key, self._clock())

    def reserve(self, key: Key, tokens: int) -> Refusal | None:
        """Charge a let-in request's estimated tokens (settled by `release` with `reserved(key, tokens)`)."""
        if key is ANONYMOUS:
            return None
        return self.limits.reserve(key, tokens, self._clock())

    def release(self, key: Key, tokens: int, reserved: int = 0, *, passed_on: bool = True) -> None:
        if key is not ANONYMOUS:
            self.limits.release(key, tokens, self._clock(), reserved, passed_on=passed_on)

    def record(self, key: str, model: str, code: int, tokens: TokenCount, watch: Stopwatch | None = None) -> None:
        """A request ended: counted, and kept among the recent ones (`watch`: its times, once it was routed)."""
        entry = recent_request(key, model, code, tokens, watch, at=self._wall(), now=self._clock())
        with self._lock:
            self._recent.add(entry)
            self._usage.record(
                (key, model),
                code,
                prompt=tokens.prompt,
                completion=tokens.completion,
                estimated=tokens.estimated,
                now=self._wall(),
            )

    def recent(self) -> list[RecentRequest]:
        """The last requests that ended, newest first (the console's Requests page)."""
        with self._lock:
            return self._recent.newest_first()

    def totals(self) -> dict[Label, Counts]:
        """All-time counters per key and model (a copy, for /metrics)."""
        with self._lock:
            return self._usage.since(None)

    def save(self) -> None:
        """Write the counters when they changed since the last write (called off the event loop)."""
        if self._usage_file is None:
            return
        with self._lock:
            if not self._usage.changed:
                return
            self._usage.changed = False
            document = self._usage.to_json()
        try:
            write_usage(self._usage_file, document)
        except OSError as exc:
            log.warning("gateway_usage_unsaved", path=str(self._usage_file), error=exc.strerror or str(exc))
