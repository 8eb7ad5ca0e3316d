"""Who may use the gateway and how much (the shell around keys.py, limits.py and usage.py).

The key set is read again when the daemon's `[gateway]` settings change identity (each accepted
reload reads the config anew): a request in flight keeps the key it was let in with; a key set
that cannot be read now is logged (`gateway_keys_refused`) and the one before is kept, never none.
The usage counters are kept in memory under a lock (the gateway's loop writes, /metrics reads from
another thread) and written to the state dir every `SAVE_SECONDS` when they changed, and at close.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from dankserve.errors import DankserveError
from dankserve.gateway.keys import Key, KeyRing, bearer
from dankserve.gateway.keys_dir import read_keys
from dankserve.gateway.limits import KeyLimits, Refusal
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
    """Keys (re-read on reload), per-key limits, usage counters."""

    def __init__(
        self,
        settings: Callable[[], GatewaySettings | None],
        usage_file: Path | None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        first = settings()
        assert first is not None
        self._ring = read_keys(first.keys_dir, first.api_key_file)  # at start a bad key set stops the daemon
        self._read_for: GatewaySettings = first
        self.limits = KeyLimits()
        self._clock, self._wall = clock, wall
        self._usage_file = usage_file
        self._usage = load_usage(usage_file) if usage_file is not None else Usage()
        self._lock = threading.Lock()

    def ring(self) -> KeyRing:
        current = self._settings()
        if current is not None and current is not self._read_for:
            self._read_for = current
            try:
                ring = read_keys(current.keys_dir, current.api_key_file)
            except DankserveError as exc:
                log.error("gateway_keys_refused", error=exc.message, fix=exc.fix, keeping="the keys read before")
            else:
                if ring != self._ring:
                    log.info("gateway_keys_read", keys=[k.name for k in ring.keys])
                self._ring = ring
                self.limits.forget_others({k.name for k in ring.keys})
        return self._ring

    def identify(self, authorization: list[str]) -> Key | Denied:
        """The request's key by its Authorization header(s): exactly one `Bearer KEY` of a configured key."""
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

    def record(self, key: str, model: str, code: int, tokens: TokenCount) -> None:
        with self._lock:
            self._usage.record(
                (key, model),
                code,
                prompt=tokens.prompt,
                completion=tokens.completion,
                estimated=tokens.estimated,
                now=self._wall(),
            )

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
