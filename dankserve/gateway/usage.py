"""The gateway's own counters per key and model (pure): requests by status code, prompt and completion
tokens; all-time totals (for /metrics) and hourly buckets (for `dankserve usage --since`).

Bounded: labels are a configured key's name (or `-` for no key) and a routed model name (or `-`),
so series are keys x names x codes; `MAX_SERIES` caps them anyway, and hourly buckets older than
`RETENTION_HOURS` are dropped. `to_json`/`from_json` are the file's shape (usage_store.py writes it).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

NO_LABEL = "-"
CLIENT_CLOSED = 499
"""The code counted for a client that left before its answer ended (nginx's): it had its 200, the server did
not fail, so it is neither a 200 nor a 5xx."""
HIDDEN_KEYS = "*"
"""The key label of every named key together, where key names are not shown (`hide_key_names`)."""
MAX_SERIES = 20_000
"""Totals and hourly rows each at most this many (the oldest hours go first)."""
RETENTION_HOURS = 24 * 92
VERSION = 1


@dataclass
class Counts:
    """One key and model's numbers (over all time, or one hour)."""

    requests: dict[int, int] = field(default_factory=dict)
    """By HTTP status code."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated_tokens: int = 0
    """Of completion_tokens, how many were counted from events, not read from usage (tokens.py)."""

    def add(self, code: int, prompt: int, completion: int, estimated: bool) -> None:
        self.requests[code] = self.requests.get(code, 0) + 1
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        if estimated:
            self.estimated_tokens += completion

    def merge(self, other: Counts) -> None:
        for code, n in other.requests.items():
            self.requests[code] = self.requests.get(code, 0) + n
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.estimated_tokens += other.estimated_tokens

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": {str(c): n for c, n in sorted(self.requests.items())},
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "estimated_tokens": self.estimated_tokens,
        }

    @classmethod
    def from_json(cls, data: Any) -> Counts:
        if not isinstance(data, dict) or not isinstance(data.get("requests"), dict):
            raise ValueError("a row without requests")
        requests = {}
        for code, n in data["requests"].items():
            if not (isinstance(code, str) and code.isdigit() and 100 <= int(code) <= 599 and _count(n)):
                raise ValueError(f"a bad request count {code!r}: {n!r}")
            requests[int(code)] = n
        tokens = [data.get(k, 0) for k in ("prompt_tokens", "completion_tokens", "estimated_tokens")]
        if not all(_count(t) for t in tokens):
            raise ValueError("a bad token count")
        return cls(requests, *tokens)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62


Label = tuple[str, str]
"""(key name, model name)."""


class Usage:
    """Totals and hourly buckets; `record` is called once per answered request."""

    def __init__(self) -> None:
        self.totals: dict[Label, Counts] = {}
        self.hours: dict[tuple[int, str, str], Counts] = {}
        self.changed = False
        self._trimmed_at = -1

    def record(self, label: Label, code: int, *, prompt: int, completion: int, estimated: bool, now: float) -> None:
        """One request's outcome at wall-clock `now` (seconds since the epoch)."""
        hour = int(now // 3600)
        total = self.totals.get(label)
        if total is None:
            if len(self.totals) >= MAX_SERIES:
                label = (NO_LABEL, NO_LABEL)  # beyond the cap: counted, but not apart
            total = self.totals.setdefault(label, Counts())
        total.add(code, prompt, completion, estimated)
        slot = (hour, *label)
        bucket = self.hours.get(slot)
        if bucket is None:
            self._trim(hour)
            bucket = self.hours[slot] = Counts()
        bucket.add(code, prompt, completion, estimated)
        self.changed = True

    def _trim(self, hour: int) -> None:
        """Before a new hourly row: drop rows past RETENTION_HOURS (once an hour), then the oldest beyond the cap."""
        if hour != self._trimmed_at:
            self._trimmed_at = hour
            for slot in [s for s in self.hours if s[0] < hour - RETENTION_HOURS]:
                del self.hours[slot]
        while len(self.hours) >= MAX_SERIES:
            del self.hours[min(self.hours)]

    def since(self, start: float | None) -> dict[Label, Counts]:
        """Per key and model from the hour holding `start` on (None: all time)."""
        if start is None:
            return {label: _copy(c) for label, c in self.totals.items()}
        first = int(start // 3600)
        out: dict[Label, Counts] = {}
        for (hour, key, model), counts in self.hours.items():
            if hour >= first:
                out.setdefault((key, model), Counts()).merge(counts)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "totals": [{"key": k, "model": m, **c.to_json()} for (k, m), c in sorted(self.totals.items())],
            "hours": [{"hour": h, "key": k, "model": m, **c.to_json()} for (h, k, m), c in sorted(self.hours.items())],
        }

    @classmethod
    def from_json(cls, data: Any) -> Usage:
        """The counters of a file's document; ValueError for anything not of this shape."""
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError("not a gateway usage document of version 1")
        usage = cls()
        for row in _rows(data, "totals"):
            usage.totals[(row["key"], row["model"])] = Counts.from_json(row)
        for row in _rows(data, "hours"):
            if not _count(row.get("hour")):
                raise ValueError("a bad hour")
            usage.hours[(row["hour"], row["key"], row["model"])] = Counts.from_json(row)
        return usage


def _rows(data: Mapping[str, Any], name: str) -> Iterator[dict[str, Any]]:
    rows = data.get(name)
    if not isinstance(rows, list) or len(rows) > MAX_SERIES:
        raise ValueError(f"{name} is not a list of at most {MAX_SERIES} rows")
    for row in rows:
        if not isinstance(row, dict) or not all(
            isinstance(row.get(k), str) and len(row[k]) <= 512 for k in ("key", "model")
        ):
            raise ValueError(f"a row of {name} without key and model")
        yield row


def hide_key_names(totals: Mapping[Label, Counts]) -> dict[Label, Counts]:
    """The counters with every key's name folded into HIDDEN_KEYS (`-`, no key, stays): what a /metrics that
    anyone on the host may scrape shows, so that local users learn neither the key names nor each one's use."""
    out: dict[Label, Counts] = {}
    for (key, model), counts in totals.items():
        out.setdefault((key if key == NO_LABEL else HIDDEN_KEYS, model), Counts()).merge(counts)
    return out


def _copy(counts: Counts) -> Counts:
    out = Counts()
    out.merge(counts)
    return out
