"""Tests for dankserve.gateway.admission: a cap per deployment, then priority and arrival order."""

from __future__ import annotations

from dankserve.gateway.admission import Admission


def test_requests_enter_up_to_the_cap() -> None:
    """Below the cap a request enters at once; at it, it must queue."""
    admission = Admission()
    assert admission.enter("a", 2) and admission.enter("a", 2)
    assert not admission.enter("a", 2)
    assert admission.enter("b", 2)  # each deployment has its own
    admission.leave("a")
    assert admission.enter("a", 2) and admission.in_flight("a") == 2


def test_no_cap_lets_everything_in() -> None:
    """A deployment whose cap is unknown has none."""
    admission = Admission()
    assert all(admission.enter("a", None) for _ in range(1000))


def test_higher_priority_goes_first_then_arrival_order() -> None:
    """When room frees, the waiter with the highest priority takes it; equal ones in arrival order."""
    admission = Admission()
    assert admission.enter("a", 1)
    low, first, high, second = (admission.queue("a", p) for p in (0, 1, 5, 1))
    admission.leave("a")
    assert not admission.take(low, 1) and not admission.take(first, 1)
    assert admission.take(high, 1)
    admission.leave("a")
    assert admission.take(first, 1)
    admission.leave("a")
    assert not admission.enter("a", 1)  # others wait before it: a newcomer does not jump the line
    assert admission.take(second, 1)
    admission.leave("a")
    assert admission.take(low, 1)


def test_a_waiter_that_gives_up_leaves_the_line() -> None:
    """A dropped ticket no longer blocks those behind it."""
    admission = Admission()
    assert admission.enter("a", 1)
    gone, next_one = admission.queue("a", 9), admission.queue("a", 0)
    admission.drop(gone)
    admission.leave("a")
    assert admission.waiting("a") == 1
    assert admission.take(next_one, 1) and admission.waiting("a") == 0


def test_a_full_line_gives_the_last_of_a_lower_priority_place_to_a_higher_one() -> None:
    """displace: the last in line of the lowest priority leaves (and is told); equal or higher ones never do."""
    admission = Admission()
    assert admission.enter("a", 1)
    early_low, mid, late_low = admission.queue("a", -5), admission.queue("a", 3), admission.queue("a", -5)
    assert admission.displace("a", -5) is None  # an equal priority displaces no one
    assert admission.displace("a", 0) == late_low
    assert admission.displaced(late_low) and not admission.displaced(early_low)
    assert admission.waiting("a") == 2
    admission.drop(late_low)
    assert not admission.displaced(late_low) and admission.waiting("a") == 2
    assert admission.displace("a", 10) == early_low
    assert admission.displace("a", 10) == mid
    assert admission.displace("a", 10) is None and admission.waiting("a") == 0
