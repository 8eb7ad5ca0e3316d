"""Per-key limits (no I/O, the clock passed in): requests and tokens per minute as token buckets, and
requests in flight.

A bucket holds up to a minute's allowance and refills evenly (`requests_per_minute = 60`: one a
second, up to 60 at once after a quiet minute). A request is checked as soon as its key is known,
before its body is read (`admit`: in flight, one request from the request bucket, a token bucket
above zero), so a key over its limits holds no connection with a slow body. Once the body is read
its tokens are estimated (tokens.estimate) and taken from the token bucket (`reserve`; refused when
the bucket holds less, at most a minute's allowance asked), so a burst of parallel requests is
charged as it comes in; when the answer ends the estimate is settled against the tokens used
(`release`): given back, or the rest charged (the bucket may go below zero: the next requests wait
until it refills above zero).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dankserve.gateway.keys import Key


@dataclass(frozen=True)
class Refusal:
    """A limit a request hit: which (for the 429's message) and the seconds until it may be let in."""

    limit: str
    value: int
    retry_after: int


@dataclass
class _Bucket:
    level: float
    at: float

    def refill(self, per_minute: int, now: float) -> None:
        self.level = min(float(per_minute), self.level + max(0.0, now - self.at) * per_minute / 60.0)
        self.at = now

    def seconds_until(self, wanted: float, per_minute: int) -> float:
        return max(0.0, (wanted - self.level) * 60.0 / per_minute)


@dataclass
class _KeyState:
    requests: _Bucket
    tokens: _Bucket
    in_flight: int = 0


class KeyLimits:
    """Each key's buckets and requests in flight, by key name (kept across a reload that keeps the name)."""

    def __init__(self) -> None:
        self._states: dict[str, _KeyState] = {}

    def _state(self, key: Key, now: float) -> _KeyState:
        state = self._states.get(key.name)
        if state is None:
            rpm, tpm = key.requests_per_minute or 0, key.tokens_per_minute or 0
            state = self._states[key.name] = _KeyState(_Bucket(float(rpm), now), _Bucket(float(tpm), now))
        return state

    def admit(self, key: Key, now: float) -> Refusal | None:
        """Let a request of `key` in (counted in flight until `release`), or the limit it hits."""
        state = self._state(key, now)
        if key.max_concurrent is not None and state.in_flight >= key.max_concurrent:
            return Refusal("max_concurrent", key.max_concurrent, 1)
        if key.requests_per_minute is not None:
            state.requests.refill(key.requests_per_minute, now)
            if state.requests.level < 1.0:
                wait = state.requests.seconds_until(1.0, key.requests_per_minute)
                return Refusal("requests_per_minute", key.requests_per_minute, max(1, math.ceil(wait)))
        if key.tokens_per_minute is not None:
            state.tokens.refill(key.tokens_per_minute, now)
            if state.tokens.level <= 0.0:
                wait = state.tokens.seconds_until(1.0, key.tokens_per_minute)
                return Refusal("tokens_per_minute", key.tokens_per_minute, max(1, math.ceil(wait)))
        if key.requests_per_minute is not None:
            state.requests.level -= 1.0
        state.in_flight += 1
        return None

    def reserve(self, key: Key, tokens: int, now: float) -> Refusal | None:
        """Take a let-in request's estimated `tokens` from its key's token bucket, or the refusal when the bucket
        holds less (`release(..., passed_on=False)` ends it then). What it takes is `reserved(key, tokens)`."""
        if key.tokens_per_minute is None:
            return None
        state = self._state(key, now)
        state.tokens.refill(key.tokens_per_minute, now)
        wanted = self.reserved(key, tokens)
        if state.tokens.level < wanted:
            wait = state.tokens.seconds_until(wanted, key.tokens_per_minute)
            return Refusal("tokens_per_minute", key.tokens_per_minute, max(1, math.ceil(wait)))
        state.tokens.level -= wanted
        return None

    @staticmethod
    def reserved(key: Key, tokens: int) -> int:
        """What `reserve` takes for an estimate: at most the key's minute's allowance (so that any request gets
        in after a quiet minute); nothing for a key without tokens_per_minute."""
        return 0 if key.tokens_per_minute is None else max(0, min(tokens, key.tokens_per_minute))

    def release(self, key: Key, tokens: int, now: float, reserved: int = 0, *, passed_on: bool = True) -> None:
        """A request of `key` ended, having used `tokens` (prompt and completion) against the `reserved` it was
        charged when let in: the difference is settled. One refused after `admit` (its body, its model, its
        tokens), never `passed_on`, gives its request back."""
        state = self._state(key, now)
        state.in_flight = max(0, state.in_flight - 1)
        if not passed_on and key.requests_per_minute is not None:
            state.requests.refill(key.requests_per_minute, now)
            state.requests.level = min(float(key.requests_per_minute), state.requests.level + 1.0)
        if key.tokens_per_minute is not None and tokens != reserved:
            state.tokens.refill(key.tokens_per_minute, now)
            state.tokens.level = min(float(key.tokens_per_minute), state.tokens.level + reserved - max(0, tokens))

    def in_flight(self, name: str) -> int:
        state = self._states.get(name)
        return 0 if state is None else state.in_flight

    def forget_others(self, names: set[str]) -> None:
        """Drop the state of keys no longer configured (a reload removed them) that have nothing in flight."""
        for name in [n for n, s in self._states.items() if n not in names and s.in_flight == 0]:
            del self._states[name]
