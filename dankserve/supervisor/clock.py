"""The clock the supervisor's interpreters read and wait on (tests use `dankserve.testing.FakeClock`)."""

from __future__ import annotations

import queue
import time
from typing import Protocol, TypeVar

T = TypeVar("T")


class Clock(Protocol):
    """Monotonic time for deadlines, wall time for records, and waiting on an inbox until a timeout."""

    def monotonic(self) -> float: ...

    def time(self) -> float: ...

    def wait(self, inbox: queue.Queue[T], timeout: float | None) -> T | None:
        """The next inbox item, or None once `timeout` seconds passed without one (None: wait for one)."""
        ...


class SystemClock:
    """The real clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def wait(self, inbox: queue.Queue[T], timeout: float | None) -> T | None:
        try:
            return inbox.get(timeout=timeout)
        except queue.Empty:
            return None
