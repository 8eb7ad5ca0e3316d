"""One way for the tests to wait for a condition: poll it until it holds or a deadline passes.

Every wait in the suite goes through `wait_until` so none sleeps longer than the condition takes,
and a wait that runs out says what it waited for and what it saw last.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A condition did not hold in time (an AssertionError, so pytest shows it as a test failure)."""


def wait_until(
    predicate: Callable[[], T | None],
    timeout: float = 10.0,
    interval: float = 0.05,
    what: str | Callable[[], str] = "the condition",
) -> T:
    """Call `predicate` until it returns something truthy; return that value.

    Raises WaitTimeout after `timeout` seconds (the predicate is always tried at least once, and
    once more at the deadline). `what` names the condition in the message; a callable is asked
    only on timeout (for a log tail or the last state seen).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            described = what() if callable(what) else what
            raise WaitTimeout(f"waited {timeout:g} s for {described}; last saw {value!r}")
        time.sleep(min(interval, remaining))


def holds_within(predicate: Callable[[], object], timeout: float, interval: float = 0.1) -> bool:
    """Whether `predicate` came true within `timeout` seconds (for a test that records the answer
    rather than failing on it: the fault-injection suite counts what it saw)."""
    try:
        wait_until(predicate, timeout, interval)
    except WaitTimeout:
        return False
    return True
