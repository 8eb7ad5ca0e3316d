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


def hold_for(seconds: float, why: str) -> None:
    """Let `seconds` pass on purpose: the time itself is the scenario (a fault held open, a
    deliberately slow client, a child that must stay alive), not a wait for something.

    `why` says what the time is for; it is required so every fixed pause in the suite is
    explained where it is written, and the suite rules (tests/test_suite_rules.py) can forbid
    bare sleeps everywhere else.
    """
    if not why:
        raise ValueError("hold_for needs a reason: say what the fixed time is for")
    time.sleep(seconds)


def first_problem(check: Callable[[], str | None], seconds: float, interval: float = 0.1) -> str | None:
    """Call `check` for the whole of `seconds` (a watch over a window that is the point of the test);
    return the first problem it names (ending the watch there), or None when it named none.

    For a test that records what went wrong rather than failing on it (the fault-injection suite),
    and the core of `stays_true`.
    """
    deadline = time.monotonic() + seconds
    while True:
        problem = check()
        if problem is not None:
            return problem
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        time.sleep(min(interval, remaining))


def stays_true(
    predicate: Callable[[], object],
    seconds: float,
    interval: float = 0.1,
    what: str | Callable[[], str] = "the condition",
) -> None:
    """Check that `predicate` holds for the whole of `seconds` (a negative check: "for 2 s nothing
    boots twice"); fail at the first moment it does not, naming `what`.

    The window is the point of the test, so it runs in full when all is well; a break ends it
    early instead of after the whole window.
    """
    broke = first_problem(lambda: None if predicate() else "broke", seconds, interval)
    if broke is not None:
        described = what() if callable(what) else what
        raise AssertionError(f"{described} stopped holding within the {seconds:g} s it had to hold for")
