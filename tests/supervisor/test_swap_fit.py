"""Tests for dankserve.supervisor.fleet.swap_fit and make_room's use of it: groups from fit, eviction by
measured cost and recency, minimum residency, and members busy with requests (tables)."""

from __future__ import annotations

import pytest

from dankserve.state import DeploymentState
from dankserve.supervisor.fleet.swap import CannotFit, Member, MemberState, Swap, Wait, make_room
from dankserve.supervisor.fleet.swap_fit import eviction_order, resident, wake_cost_seconds

AWAKE, ASLEEP = MemberState.AWAKE, MemberState.ASLEEP
GPU = frozenset({"GPU-0"})
NOW = 1000.0


def member(
    name: str,
    util: float,
    state: MemberState = AWAKE,
    *,
    used: float = 0.0,
    cost: float | None = None,
    resident_until: float = 0.0,
    in_flight: int = 0,
) -> Member:
    return Member(name, GPU, util, state, used, in_flight, False, cost, resident_until)


@pytest.mark.parametrize(
    ("members", "waking", "expected"),
    [
        # Several small members are awake together: a third small one fits beside them.
        ([member("a", 0.2), member("b", 0.2), member("c", 0.2, ASLEEP)], "c", Swap(())),
        # One large one needs them all gone.
        ([member("a", 0.2), member("b", 0.2), member("big", 0.9, ASLEEP)], "big", Swap(("a", "b"))),
        # Cheapest to bring back per idle second goes first: b (0.2 s wake) before a (30 s boot), both idle 100 s.
        (
            [member("a", 0.5, used=900, cost=30.0), member("b", 0.4, used=900, cost=0.2), member("c", 0.4, ASLEEP)],
            "c",
            Swap(("b",)),
        ),
        # An expensive member idle for long goes before a cheap one used a moment ago.
        (
            [member("a", 0.5, used=0, cost=5.0), member("b", 0.4, used=999, cost=0.5), member("c", 0.4, ASLEEP)],
            "c",
            Swap(("a",)),
        ),
        # Inside its minimum residency: not evicted; the other one is.
        (
            [
                member("a", 0.4, used=0, cost=0.1, resident_until=NOW + 5),
                member("b", 0.4, used=999, cost=9.0),
                member("c", 0.4, ASLEEP),
            ],
            "c",
            Swap(("b",)),
        ),
    ],
)
def test_make_room_by_fit_cost_and_recency(members: list[Member], waking: str, expected: Swap) -> None:
    """Planned shares decide who may be awake together; cost per idle second and residency pick who sleeps."""
    assert make_room(members, waking, NOW) == expected


def test_a_member_inside_its_residency_makes_the_wake_wait_for_it() -> None:
    """Only a resident member could make room: the wake waits (no thrash), naming it and min_awake_seconds."""
    decision = make_room([member("a", 0.9, resident_until=NOW + 10), member("b", 0.9, ASLEEP)], "b", NOW)
    assert isinstance(decision, Wait) and decision.waits_for == ("a",)
    assert "min_awake_seconds" in decision.reason
    assert make_room([member("a", 0.9, resident_until=NOW + 10), member("b", 0.9, ASLEEP)], "b", NOW + 10) == Swap(
        ("a",)
    )


def test_a_member_with_requests_in_flight_is_never_put_to_sleep_whatever_its_cost() -> None:
    """In flight: waited for even when it is the cheapest to bring back."""
    decision = make_room([member("a", 0.9, cost=0.01, in_flight=1), member("b", 0.9, ASLEEP)], "b", NOW)
    assert isinstance(decision, Wait) and decision.waits_for == ("a",)


def test_a_member_larger_than_the_budget_cannot_fit() -> None:
    """Its own share over the budget: refused, whatever sleeps."""
    assert isinstance(make_room([member("big", 0.99, ASLEEP)], "big", NOW), CannotFit)


def test_without_a_clock_the_order_is_least_recently_used() -> None:
    """make_room without `now` (and eviction_order) keeps the old rule."""
    members = [member("a", 0.5, used=5, cost=0.1), member("b", 0.5, used=1, cost=99.0)]
    assert [m.name for m in eviction_order(members, None)] == ["b", "a"]
    assert [m.name for m in eviction_order(members, NOW)] == ["a", "b"]


@pytest.mark.parametrize(
    ("until", "now", "expected"), [(0.0, NOW, False), (NOW + 1, NOW, True), (NOW, NOW, False), (NOW + 1, None, False)]
)
def test_residency_holds_until_its_end(until: float, now: float | None, expected: bool) -> None:
    """A member is resident strictly before its residency ends (never without a clock)."""
    assert resident(member("a", 0.5, resident_until=until), now) is expected


@pytest.mark.parametrize(
    ("timings", "level", "cost"),
    [
        ({}, "1", None),
        ({"wake": (0.2, 0.3, 0.25)}, "1", 0.25),
        ({"wake": (0.2,), "warm": (12.0,), "cold": (40.0,)}, "stop", 12.0),
        ({"cold": (40.0,)}, "stop", 40.0),
    ],
)
def test_the_cost_to_bring_back_comes_from_history(
    timings: dict[str, tuple[float, ...]], level: str, cost: float | None
) -> None:
    """Its predicted wake, or its boot (warm, else cold) when it sleeps by stop."""
    assert wake_cost_seconds(DeploymentState(timings=timings), level) == cost
