"""Tests for dankserve.supervisor.fleet.swap: who sleeps so another can wake, idle sleep, sleep level."""

from __future__ import annotations

import pytest

from dankserve.supervisor.fleet.swap import (
    CannotFit,
    Member,
    MemberState,
    SleepLevel,
    Swap,
    Wait,
    draining,
    idle_sleepers,
    joins_asleep,
    make_room,
    next_swap_at,
    recent_swaps,
    sleep_level,
    sleeps_after_first_boot,
)

A, S, W, F = MemberState.AWAKE, MemberState.ASLEEP, MemberState.WAKING, MemberState.SLEEPING
G0, G1 = frozenset({"gpu-0"}), frozenset({"gpu-1"})
BOTH = G0 | G1
GIB = 1 << 30


def m(
    name: str,
    util: float,
    state: MemberState,
    used: float,
    *,
    gpus: frozenset[str] = G0,
    busy: int = 0,
    pin: bool = False,
) -> Member:
    return Member(name, gpus, util, state, used, in_flight=busy, pinned=pin)


@pytest.mark.parametrize(
    ("members", "waking", "expected"),
    [
        # Two at 0.9 on one GPU: the awake one sleeps.
        ([m("a", 0.9, A, 10), m("b", 0.9, S, 5)], "b", Swap(("a",))),
        # Already awake or waking: nothing to do.
        ([m("a", 0.9, A, 10), m("b", 0.9, S, 5)], "a", Swap(())),
        ([m("a", 0.9, S, 10), m("b", 0.9, W, 5)], "b", Swap(())),
        # It fits beside the awake ones: nobody sleeps.
        ([m("a", 0.4, A, 10), m("b", 0.5, S, 5)], "b", Swap(())),
        # Least recently used first, and only as many as needed.
        ([m("a", 0.3, A, 10), m("b", 0.3, A, 1), m("c", 0.3, A, 5), m("d", 0.3, S, 0)], "d", Swap(("b",))),
        ([m("a", 0.3, A, 10), m("b", 0.3, A, 1), m("c", 0.3, A, 5), m("d", 0.6, S, 0)], "d", Swap(("b", "c"))),
        # A member on another GPU does not help and is left awake.
        ([m("x", 0.9, A, 0, gpus=G1), m("a", 0.9, A, 10), m("b", 0.9, S, 5)], "b", Swap(("a",))),
        # Over two GPUs: each over-full GPU gets room.
        (
            [m("x", 0.9, A, 0, gpus=G1), m("a", 0.9, A, 10), m("b", 0.5, S, 5, gpus=BOTH)],
            "b",
            Swap(("x", "a")),
        ),
        # Pinned is never chosen: the next least recently used goes.
        ([m("p", 0.3, A, 0, pin=True), m("a", 0.3, A, 10), m("b", 0.6, S, 5)], "b", Swap(("a",))),
        # A busy member is skipped when an idle one makes room ...
        ([m("a", 0.45, A, 1, busy=2), m("c", 0.45, A, 9), m("b", 0.5, S, 5)], "b", Swap(("c",))),
        # ... and asleep members hold nothing.
        ([m("a", 0.9, S, 1), m("c", 0.9, S, 9), m("b", 0.9, S, 5)], "b", Swap(())),
    ],
)
def test_make_room_swaps(members: list[Member], waking: str, expected: Swap) -> None:
    """The sleepers chosen so the woken member fits: LRU first, as few as needed, never pinned."""
    assert make_room(members, waking) == expected


@pytest.mark.parametrize(
    ("members", "waiting_for"),
    [
        ([m("a", 0.9, A, 10, busy=1), m("b", 0.9, S, 5)], "a"),
        ([m("a", 0.9, F, 10), m("b", 0.9, S, 5)], "a"),
        ([m("a", 0.9, W, 10), m("b", 0.9, S, 5)], "a"),
        ([m("a", 0.5, A, 1, busy=1), m("c", 0.4, A, 9), m("b", 0.9, S, 5)], "a"),
    ],
)
def test_make_room_waits_for_busy_waking_or_settling_members(members: list[Member], waiting_for: str) -> None:
    """Only a member with requests in flight (or mid-transition) could make room: wait, sleep nobody."""
    result = make_room(members, "b")
    assert isinstance(result, Wait)
    assert waiting_for in result.reason


@pytest.mark.parametrize(
    ("members", "named"),
    [
        ([m("p", 0.9, A, 0, pin=True), m("b", 0.9, S, 5)], "pinned p"),
        ([m("b", 0.97, S, 5)], "more than 0.95"),
    ],
)
def test_make_room_cannot_fit(members: list[Member], named: str) -> None:
    """Pinned members in the way, or a member larger than the budget: CannotFit naming why."""
    result = make_room(members, "b")
    assert isinstance(result, CannotFit)
    assert named in result.reason


def test_idle_sleepers() -> None:
    """Awake, unpinned, idle past their limit, no requests in flight; oldest first; None never sleeps."""
    members = [
        m("old", 0.3, A, 0),
        m("older", 0.3, A, -10),
        m("fresh", 0.3, A, 95),
        m("busy", 0.3, A, 0, busy=1),
        m("pinned", 0.3, A, 0, pin=True),
        m("asleep", 0.3, S, 0),
        m("never", 0.3, A, 0),
    ]
    limits: dict[str, float | None] = {n.name: 60.0 for n in members} | {"never": None}
    assert idle_sleepers(members, limits, now=100) == ["older", "old"]


@pytest.mark.parametrize(
    ("weights", "available", "sleep_mode", "level_2", "level"),
    [
        (16 * GIB, 64 * GIB, True, True, SleepLevel.LEVEL_1),
        (60 * GIB, 64 * GIB, True, True, SleepLevel.LEVEL_1),
        (61 * GIB, 64 * GIB, True, True, SleepLevel.LEVEL_2),  # beyond the 4 GiB reserve
        (140 * GIB, 64 * GIB, True, True, SleepLevel.LEVEL_2),
        (140 * GIB, 64 * GIB, True, False, SleepLevel.STOP),
        (16 * GIB, 64 * GIB, False, True, SleepLevel.STOP),
        (16 * GIB, 2 * GIB, True, True, SleepLevel.LEVEL_2),
    ],
)
def test_sleep_level(weights: int, available: int, sleep_mode: bool, level_2: bool, level: SleepLevel) -> None:
    """Level 1 when RAM holds the weights, else level 2 where supported, else stop and boot; with a reason."""
    choice = sleep_level(weights, available, sleep_mode=sleep_mode, level_2=level_2)
    assert choice.level is level
    assert choice.reason


def test_first_boots_all_but_the_first_sleep() -> None:
    """At start-up every member but the group's first is put to sleep once ready."""
    order = ["a", "b", "c"]
    assert [sleeps_after_first_boot(n, order) for n in order] == [False, True, True]
    assert sleeps_after_first_boot("a", []) is False


def test_a_configured_sleep_level_wins_unless_the_server_has_no_sleep_mode() -> None:
    """sleep_level = 1, 2 or stop is used as set; without sleep mode every level is a stop."""
    from dankserve.supervisor.fleet.swap import forced_level

    assert forced_level("2", sleep_mode=True).level is SleepLevel.LEVEL_2
    assert forced_level("stop", sleep_mode=True).level is SleepLevel.STOP
    assert forced_level("1", sleep_mode=False).level is SleepLevel.STOP


def test_a_member_added_to_a_running_group_joins_asleep() -> None:
    """Added by a reload: asleep when its group already runs; a new group's members (or one outside any) boot."""
    assert joins_asleep("g", ["g", None]) is True
    assert joins_asleep("h", ["g", None]) is False
    assert joins_asleep(None, [None, "g"]) is False


def test_a_change_of_what_only_swapping_reads_plans_the_same_server() -> None:
    """pinned, idle_sleep_seconds, sleep_level among auto/1/2: the same server; anything else, or stop, a new one."""
    from dankserve.settings import DeploymentSettings
    from dankserve.supervisor.fleet.swap import server_unchanged

    base = {"model": "m", "port": 8001, "swap_group": "g"}
    old = DeploymentSettings.model_validate(base)
    for same in (
        {"pinned": True},
        {"idle_sleep_seconds": 60},
        {"sleep_level": "2"},
        {"sleep_level": "1", "pinned": True},
    ):
        assert server_unchanged(old, DeploymentSettings.model_validate({**base, **same})), same
    for other in ({"max_num_seqs": 7}, {"sleep_level": "stop"}, {"swap_group": "h"}, {"pinned": True, "port": 8002}):
        assert not server_unchanged(old, DeploymentSettings.model_validate({**base, **other})), other
    stopping = DeploymentSettings.model_validate({**base, "sleep_level": "stop"})
    assert not server_unchanged(stopping, old)
    assert server_unchanged(
        stopping, DeploymentSettings.model_validate({**base, "sleep_level": "stop", "pinned": True})
    )


def test_the_swap_bound_lets_swaps_begin_until_a_minute_holds_its_count() -> None:
    """Two per minute: a third waits until the oldest of the last two leaves the window; no bound never waits."""
    assert next_swap_at((), 100.0, 2) is None
    assert next_swap_at((90.0,), 100.0, 2) is None
    assert next_swap_at((50.0, 90.0, 95.0), 100.0, 2) == 150.0
    assert next_swap_at((30.0, 35.0), 100.0, 2) is None, "both left the window"
    assert next_swap_at((90.0, 95.0, 99.0), 100.0, None) is None
    assert recent_swaps((95.0, 30.0, 90.0), 100.0) == (90.0, 95.0)


def test_a_wake_waiting_for_busy_awake_members_drains_only_them() -> None:
    """The awake member busy with requests drains; one still waking is waited for but not drained."""
    members = [
        Member("a", G0, 0.5, A, 1.0, in_flight=2),
        Member("b", G0, 0.45, W, 2.0),
        Member("c", G0, 0.9, S, 0.0),
    ]
    decision = make_room(members, "c")
    assert isinstance(decision, Wait) and set(decision.waits_for) == {"a", "b"}
    assert draining(decision, members) == ("a",)
    assert draining(Swap(("a",)), members) == ()
