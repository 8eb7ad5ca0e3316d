"""The recent sleeps and wakes of swap group members with their checks (bounded, in memory): `status --json`'s
`swaps` and the console's Swap page.

A member's sleep or wake is checked where it is done (`SwapVerifier`: NVML's reading after a sleep, the
canary after a wake) and ends where the worker publishes its machine's new state (`Recorder.published`,
which times it): the checks wait under the member's name until then. One that fails (its check, or the
server's /sleep or /wake_up) is kept at once with its reason. At most `SWAP_HISTORY` entries, newest
first; a restart of the daemon starts afresh (the counts outlive it in /metrics' scrapes, not here).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from dankserve.supervisor import machine as m

SWAP_HISTORY = 100

Kind = Literal["sleep", "wake"]
Verdict = Literal["passed", "failed", "not checked"]


@dataclass(frozen=True)
class SwapCheck:
    """One check of a sleep (`memory`: NVML's reading of the member's processes) or a wake (`canary`)."""

    check: Literal["memory", "canary"]
    verdict: Verdict
    detail: str
    held_bytes: int | None = None
    """The most the member's processes held on one GPU asleep (the memory check's reading)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SwapEntry:
    at: float
    """Wall-clock seconds when it ended."""
    deployment: str
    group: str | None
    kind: Kind
    level: str | None
    """"1", "2", "stop" (a stopped member wakes by booting) or "suspend" (level 1 and a GPU checkpoint)."""
    seconds: float | None
    failure: str | None
    """Why it failed (None: it did what was asked)."""
    checks: tuple[SwapCheck, ...]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.failure is None, "checks": [c.to_json() for c in self.checks]}


def swap_failure(event: m.Event) -> str | None:
    """Why a sleep or wake did not do what was asked, by the event it answered (None: it did)."""
    match event:
        case m.FellAsleep() | m.WokeUp():
            return None
        case m.SleepKeptMemory(message=message) | m.WokeWrong(message=message):
            return message
        case m.SleepFailed(message=message) | m.WakeFailed(message=message):
            return message
        case m.SuspendFailed(reason=reason):
            return f"the GPU checkpoint failed, asleep at plain level 1 instead: {reason}"
        case m.SleepUnsupported(reason=reason):
            return f"no sleep mode: {reason} (stopped instead)"
    return type(event).__name__


class SwapHistory:
    """The last SWAP_HISTORY sleeps and wakes (written by the workers' threads, read by status)."""

    def __init__(self, size: int = SWAP_HISTORY) -> None:
        self._entries: deque[SwapEntry] = deque(maxlen=size)
        self._checked: dict[tuple[str, Kind], tuple[tuple[SwapCheck, ...], str | None]] = {}
        self._lock = threading.Lock()

    def checked(
        self,
        name: str,
        kind: Kind,
        checks: Sequence[SwapCheck],
        *,
        failure: str | None,
        level: str,
        group: str | None,
        at: float,
        still_ends: bool = False,
    ) -> None:
        """A sleep or wake was done and checked: kept now when it failed, else its checks wait for `ended`;
        `still_ends`: it failed, yet ends all the same (a suspend asleep at level 1 instead): its failure waits
        for `ended` with the checks."""
        with self._lock:
            if failure is None or still_ends:
                self._checked[(name, kind)] = (tuple(checks), failure)
                return
            self._checked.pop((name, kind), None)
            self._entries.append(SwapEntry(at, name, group, kind, level, None, failure, tuple(checks)))

    def ended(self, name: str, kind: Kind, level: str | None, seconds: float, *, group: str | None, at: float) -> None:
        """A sleep or wake ended in `seconds` (a wake by booting too): kept with the checks it had."""
        with self._lock:
            checks, failure = self._checked.pop((name, kind), ((), None))
            self._entries.append(SwapEntry(at, name, group, kind, level, seconds, failure, checks))

    def newest_first(self) -> list[dict[str, Any]]:
        with self._lock:
            return [entry.to_json() for entry in reversed(self._entries)]
