"""Tests for dankserve.supervisor.fleet.swap_bound: a group's swaps per minute, counted once per wake."""

from __future__ import annotations

from dankserve.supervisor.fleet.swap import CannotFit, Swap, Wait
from dankserve.supervisor.fleet.swap_bound import SwapBound


def test_a_swap_beyond_the_bound_is_held_until_the_oldest_leaves_the_minute() -> None:
    """With one swap a minute the second wake that puts another to sleep is held for the rest of the minute."""
    bound = SwapBound()
    assert not bound.holds("g", "a", Swap(sleep=("b",)), 0.0, 1)
    assert not bound.holds("g", "a", Swap(sleep=("b",)), 1.0, 1), "a wake whose swap began is counted once"
    assert bound.holds("g", "b", Swap(sleep=("a",)), 10.0, 1)
    assert bound.held_until("b") == 60.0
    assert not bound.holds("g", "b", Swap(sleep=("a",)), 61.0, 1) and bound.held_until("b") is None


def test_wakes_that_swap_nothing_are_never_held_and_a_forgotten_wake_counts_again() -> None:
    """A wake into room, or one that cannot fit, is no swap; one that waits for room is (counted once), and
    forgotten and asked again it is a new swap."""
    bound = SwapBound()
    assert not bound.holds("g", "a", Swap(sleep=()), 0.0, 1)
    assert not bound.holds("g", "a", CannotFit("too big"), 0.0, 1)
    assert not bound.holds("g", "a", Wait("b drains"), 0.0, 1), "the first swap of the minute"
    bound.forget("a")
    assert bound.holds("g", "a", Wait("b drains"), 1.0, 1)
    assert not bound.holds("g", "c", Swap(sleep=("a",)), 1.0, None), "no bound"
