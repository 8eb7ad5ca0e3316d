"""Tests for dankserve.supervisor.control.reload_requests: each reload request is answered by a reload that began
after it was asked."""

from __future__ import annotations

from dankserve.supervisor.control.reload_requests import ReloadRequests
from dankserve.supervisor.reloading import ReloadOutcome


def test_a_request_is_answered_by_the_reload_that_read_the_count_after_it() -> None:
    """A reload that read the count before a request does not answer it; the next one does."""
    requests = ReloadRequests()
    first = requests.ask()
    asked = requests.asked()  # the main loop reads this, then the file
    second = requests.ask()
    requests.answered(asked, ReloadOutcome(1.0))
    assert requests.wait(first, 0.0) == ReloadOutcome(1.0)
    assert requests.wait(second, 0.0) is None, "asked after the file was read"
    requests.answered(requests.asked(), ReloadOutcome(2.0))
    assert requests.wait(second, 0.0) == ReloadOutcome(2.0)
