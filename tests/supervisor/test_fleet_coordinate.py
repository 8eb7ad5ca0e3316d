"""Tests for dankserve.supervisor.fleet.coordinate: the fleet's pure decider of sleep, wake and boot admission.

Each test hands `coordinate` a state, a view of the members and one intent, and reads the directives and the
next state: no thread, no clock, no real time (the coordinator's thread is tested in test_fleet_coordinator.py,
the real daemon in test_swap_podman.py and test_upgrade_podman.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dankserve.supervisor import machine as m
from dankserve.supervisor.fleet import coordinate as c
from dankserve.supervisor.fleet.coordinate import (
    AdmitBoot,
    Answer,
    BootAsked,
    BootCancelled,
    BootWaits,
    FeedSleep,
    FeedWake,
    FleetState,
    FleetView,
    Look,
    MemberView,
    Sleep,
    UpgradeHold,
    UpgradeRelease,
    Wake,
    coordinate,
)

GPU = frozenset({"GPU-0"})
NOW = 1000.0


def view(members: dict[str, tuple[m.Stage, float]], bound: int | None = None, **extra: dict[str, Any]) -> FleetView:
    """Group g on one GPU, in this order: name -> (stage, utilisation); `extra[name]` sets more of a member."""
    views = {
        name: MemberView(name, "g", stage, stage.value, GPU, util, **{"last_used": 0.0, **extra.get(name, {})})
        for name, (stage, util) in members.items()
    }
    return FleetView({"g": tuple(members)}, views, bound)


def booted(fleet: FleetView) -> FleetState:
    """Start-up is over: every member had its first boot."""
    return FleetState(booted=frozenset(fleet.members))


def at(fleet: FleetView, name: str, **changes: Any) -> FleetView:
    return replace(fleet, members={**fleet.members, name: replace(fleet.members[name], **changes)})


def sleeps(directives: list[c.Directive]) -> list[str]:
    return [d.name for d in directives if isinstance(d, FeedSleep)]


def wakes(directives: list[c.Directive]) -> list[str]:
    return [d.name for d in directives if isinstance(d, FeedWake)]


def test_a_wake_puts_the_least_recently_used_unpinned_member_to_sleep_first() -> None:
    """Room for c: b (unpinned) sleeps, never the pinned a; c wakes once b is asleep."""
    fleet = view(
        {"a": (m.Stage.READY, 0.5), "b": (m.Stage.READY, 0.4), "c": (m.Stage.ASLEEP, 0.4)},
        a={"pinned": True},
        b={"last_used": 900.0},
    )
    state, out = coordinate(booted(fleet), fleet, Wake("c", "gateway"), NOW)
    assert sleeps(out) == ["b"] and wakes(out) == [], "c waits until b is asleep"
    state, out = coordinate(state, at(fleet, "b", stage=m.Stage.ASLEEP), Look(), NOW + 1)
    assert wakes(out) == ["c"] and "c" not in state.wanted


def test_a_member_busy_with_a_request_is_not_put_to_sleep_and_drains() -> None:
    """A request in flight on the only member that could make room: the wake waits, the member drains (the
    gateway holds requests for it that arrive later); once idle it sleeps and no longer drains."""
    fleet = view({"a": (m.Stage.READY, 0.9), "b": (m.Stage.ASLEEP, 0.9)}, a={"in_flight": 1})
    state, out = coordinate(booted(fleet), fleet, Wake("b", "gateway"), NOW)
    assert out == [] and c.draining(state, "a") == "b"
    state, out = coordinate(state, at(fleet, "a", in_flight=0), Look(), NOW + 1)
    assert sleeps(out) == ["a"] and c.draining(state, "a") is None


def test_a_wake_that_cannot_fit_beside_pinned_members_is_refused_with_the_reason_for_a_while() -> None:
    """A pinned member at 0.9 leaves no room for another at 0.9: refused (the gateway's 503), looked at again
    after REFUSAL_SECONDS."""
    fleet = view({"a": (m.Stage.READY, 0.9), "b": (m.Stage.ASLEEP, 0.9)}, a={"pinned": True})
    state, out = coordinate(booted(fleet), fleet, Wake("b", "cli"), NOW)
    reason = c.refused(state, "b", NOW)
    assert reason is not None and "pinned a" in reason and sleeps(out) == wakes(out) == []
    assert c.refused(state, "b", NOW + c.REFUSAL_SECONDS + 1) is None


def test_idle_members_are_put_to_sleep_and_pinned_ones_never() -> None:
    """idle_sleep_seconds passed without requests: asleep; a pinned member never."""
    fleet = view(
        {"a": (m.Stage.READY, 0.4), "b": (m.Stage.READY, 0.4)},
        a={"idle_sleep_seconds": 10.0, "last_used": NOW},
        b={"idle_sleep_seconds": 10.0, "last_used": NOW, "pinned": True},
    )
    state, out = coordinate(booted(fleet), fleet, Look(), NOW + 5)
    assert sleeps(out) == []
    _, out = coordinate(state, fleet, Look(), NOW + 10)
    assert sleeps(out) == ["a"]


def test_first_boots_come_one_at_a_time_and_the_groups_first_member_last() -> None:
    """At start-up b boots before a (the group's first), and c waits while b boots."""
    fleet = view({"a": (m.Stage.WAITING_GPUS, 0.9), "b": (m.Stage.WAITING_GPUS, 0.9), "c": (m.Stage.IDLE, 0.9)})
    state, out = coordinate(FleetState(), fleet, BootAsked(1, "b", ("GPU-0",)), NOW)
    assert out == [AdmitBoot(1)] and "b" in state.admitted
    state, out = coordinate(state, fleet, BootAsked(2, "c", ("GPU-0",)), NOW)
    assert out[-1] == BootWaits(2, "swap group g: first boots come one at a time: b boots")
    state, out = coordinate(state, fleet, BootAsked(3, "a", ("GPU-0",)), NOW)
    (told,) = [d for d in out if isinstance(d, BootWaits) and d.ticket == 3]
    assert "first boots come one at a time" in told.why
    # b ready: put to sleep (not the group's first); c boots next, a still last
    fleet = at(fleet, "b", stage=m.Stage.READY)
    state, out = coordinate(state, fleet, Look(), NOW + 1)
    assert sleeps(out) == ["b"] and AdmitBoot(2) not in out and AdmitBoot(3) not in out
    fleet = at(fleet, "b", stage=m.Stage.ASLEEP)
    state, out = coordinate(state, fleet, Look(), NOW + 1)
    assert AdmitBoot(2) in out and AdmitBoot(3) not in out
    fleet = at(fleet, "c", stage=m.Stage.READY)
    state, out = coordinate(state, fleet, Look(), NOW + 2)
    assert sleeps(out) == ["c"] and AdmitBoot(3) not in out, "a waits for room: c is falling asleep"
    state, out = coordinate(state, at(fleet, "c", stage=m.Stage.ASLEEP), Look(), NOW + 3)
    assert AdmitBoot(3) in out and state.boots == {}


def test_a_waiting_boot_is_told_why_once_per_reason_and_forgotten_when_cancelled() -> None:
    fleet = view({"a": (m.Stage.READY, 0.9), "b": (m.Stage.WAITING_GPUS, 0.9)}, a={"in_flight": 1})
    state, out = coordinate(booted(fleet), fleet, BootAsked(7, "b", ("GPU-0",)), NOW)
    assert [d for d in out if isinstance(d, BootWaits)] and c.draining(state, "a") == "b"
    state, out = coordinate(state, fleet, Look(), NOW + 1)
    assert not [d for d in out if isinstance(d, BootWaits)], "the same reason is told once"
    state, out = coordinate(state, fleet, BootCancelled(7), NOW + 2)
    assert state.boots == {} and c.draining(state, "a") is None and out == []


def test_a_member_put_to_sleep_before_it_was_seen_ready_has_had_its_first_boot() -> None:
    """Another's boot may put a member to sleep right after its ready: asleep counts as booted once."""
    fleet = view({"a": (m.Stage.WAITING_GPUS, 0.9), "b": (m.Stage.ASLEEP, 0.9)})
    state, _ = coordinate(FleetState(), fleet, Look(), NOW)
    assert "b" in state.booted
    _, out = coordinate(state, fleet, BootAsked(1, "a", ("GPU-0",)), NOW)
    assert out == [AdmitBoot(1)]


def test_a_server_adopted_awake_after_a_daemon_kill_stays_awake() -> None:
    """After kill -9 of the daemon, b (not the group's first) adopted ready stays awake; a fresh first boot sleeps."""
    fleet = view({"a": (m.Stage.ASLEEP, 0.9), "b": (m.Stage.READY, 0.9)}, b={"adopted": True})
    _, out = coordinate(FleetState(), fleet, Look(), NOW)
    assert sleeps(out) == []
    _, out = coordinate(FleetState(), at(fleet, "b", adopted=False), Look(), NOW)
    assert sleeps(out) == ["b"]


def test_a_member_asleep_by_stop_is_woken_by_a_boot_whose_admission_makes_room() -> None:
    """c, asleep by stop: its wake is fed at once (no sleep asked first); its boot's admission puts a to sleep."""
    fleet = view({"a": (m.Stage.READY, 0.9), "c": (m.Stage.ASLEEP, 0.9)}, c={"asleep_by_stop": True})
    state, out = coordinate(FleetState(), fleet, Look(), NOW)
    assert out == [] and "c" in state.booted
    state, out = coordinate(state, fleet, Wake("c", "gateway"), NOW)
    assert wakes(out) == ["c"] and sleeps(out) == []
    fleet = at(fleet, "c", stage=m.Stage.PULLING)
    state, out = coordinate(state, fleet, BootAsked(1, "c", ("GPU-0",)), NOW)
    assert sleeps(out) == ["a"] and AdmitBoot(1) not in out
    _, out = coordinate(state, at(fleet, "a", stage=m.Stage.ASLEEP), Look(), NOW + 1)
    assert AdmitBoot(1) in out


def test_the_swap_bound_holds_a_wake_until_the_group_may_swap_again() -> None:
    """max_swaps_per_minute = 1: the first swap begins; a swap back within the minute is held (nothing sleeps)
    and the time to wait is told; after the minute it begins."""
    fleet = view({"a": (m.Stage.READY, 0.9), "b": (m.Stage.ASLEEP, 0.9)}, bound=1)
    state, out = coordinate(booted(fleet), fleet, Wake("b", "gateway"), NOW)
    assert sleeps(out) == ["a"] and c.held_for(state, "b", NOW) is None
    fleet = at(fleet, "a", stage=m.Stage.ASLEEP)
    state, out = coordinate(state, fleet, Look(), NOW + 1)
    assert wakes(out) == ["b"]
    fleet = at(fleet, "b", stage=m.Stage.READY, last_used=NOW + 2)
    state, out = coordinate(state, fleet, Wake("a", "gateway"), NOW + 2)
    held = c.held_for(state, "a", NOW + 2)
    assert held is not None and 50 < held <= 60 and sleeps(out) == [] and c.draining(state, "b") is None
    _, out = coordinate(state, fleet, Look(), NOW + 61)
    assert sleeps(out) == ["b"]


def test_a_sleep_by_hand_is_answered_and_refused_unless_ready() -> None:
    fleet = view({"a": (m.Stage.READY, 0.5), "b": (m.Stage.BOOTING, 0.4)})
    _, out = coordinate(booted(fleet), fleet, Sleep("a", "by hand", "cli", ticket=1), NOW)
    assert FeedSleep("a", "by hand") in out and Answer(1, None) in out
    _, out = coordinate(booted(fleet), fleet, Sleep("b", "by hand", "cli", ticket=2), NOW)
    (answer,) = [d for d in out if isinstance(d, Answer)]
    assert answer.error is not None and "only a ready deployment" in answer.error and sleeps(out) == []


def test_an_upgrade_holds_its_gpus_from_the_other_members_of_its_swap_group() -> None:
    """Issue 40: a upgraded, its trial on GPU-0: b's wake (the gateway's or `dankserve wake`) is not served while
    the hold stands, not even once a is asleep; a wake of a itself by anyone but the upgrade is held; after
    the release b's wake is served (a swap like any other)."""
    fleet = view({"a": (m.Stage.READY, 0.5), "b": (m.Stage.ASLEEP, 0.5)})
    state, out = coordinate(booted(fleet), fleet, UpgradeHold("a", GPU), NOW)
    state, out = coordinate(state, fleet, Sleep("a", "upgrade", "upgrade", ticket=1, level="1"), NOW)
    assert FeedSleep("a", "upgrade", "1") in out
    fleet = at(fleet, "a", stage=m.Stage.ASLEEP)
    state, out = coordinate(state, fleet, Wake("b", "gateway"), NOW + 1)
    assert wakes(out) == [] and "b" in state.wanted, "held, not refused: it waits for the upgrade"
    state, out = coordinate(state, fleet, Wake("a", "cli"), NOW + 2)
    assert wakes(out) == [] and "a" not in state.wanted
    assert c.upgrade_hold(state, "b", GPU) == "a" and c.upgrade_hold(state, "a", frozenset()) == "a"
    state, out = coordinate(state, fleet, Look(), NOW + 3)
    assert wakes(out) == []
    state, out = coordinate(state, fleet, UpgradeRelease("a"), NOW + 4)
    assert wakes(out) == ["b"] and c.upgrade_hold(state, "b", GPU) is None


def test_an_upgrade_holds_boots_of_other_members_onto_its_gpus() -> None:
    fleet = view({"a": (m.Stage.ASLEEP, 0.5), "b": (m.Stage.WAITING_GPUS, 0.5)})
    state, _ = coordinate(booted(fleet), fleet, UpgradeHold("a", GPU), NOW)
    state, out = coordinate(state, fleet, BootAsked(1, "b", ("GPU-0",)), NOW)
    (told,) = [d for d in out if isinstance(d, BootWaits)]
    assert "a's upgrade" in told.why and AdmitBoot(1) not in out
    _, out = coordinate(state, fleet, UpgradeRelease("a"), NOW + 1)
    assert AdmitBoot(1) in out


def test_the_upgrade_wakes_its_own_old_server_in_no_swap_group() -> None:
    """Outside a swap group only an upgrade's wake moves a deployment (its old server asleep by stop)."""
    fleet = FleetView({}, {"x": MemberView("x", None, m.Stage.ASLEEP, "asleep", GPU, 0.9, 0.0)})
    state, out = coordinate(FleetState(), fleet, Wake("x", "gateway"), NOW)
    assert out == [] and not state.wanted
    _, out = coordinate(FleetState(), fleet, Wake("x", "upgrade"), NOW)
    assert wakes(out) == ["x"]


def test_a_wake_whose_swap_began_is_counted_once_by_the_bound() -> None:
    """While a falls asleep for b (b waits for room), looking again does not count b's swap a second time."""
    fleet = view({"a": (m.Stage.READY, 0.9), "b": (m.Stage.ASLEEP, 0.9)}, bound=1)
    state, _ = coordinate(booted(fleet), fleet, Wake("b", "gateway"), NOW)
    state, _ = coordinate(state, at(fleet, "a", stage=m.Stage.FALLING_ASLEEP), Look(), NOW + 1)
    assert c.held_for(state, "b", NOW + 1) is None and state.swaps["g"] == (NOW,)


def test_a_wake_waiting_for_room_is_a_swap_and_one_given_up_counts_again() -> None:
    """A wake that waits for a busy member begins a swap (counted); given up (b booted on its own) and asked
    again within the minute, it is held; without a bound nothing is."""
    fleet = view({"a": (m.Stage.READY, 0.9), "b": (m.Stage.ASLEEP, 0.9)}, bound=1, a={"in_flight": 1})
    state, _ = coordinate(booted(fleet), fleet, Wake("b", "gateway"), NOW)
    assert c.held_for(state, "b", NOW) is None and state.swaps["g"] == (NOW,)
    state, _ = coordinate(state, at(fleet, "b", stage=m.Stage.BOOTING), Look(), NOW + 1)
    assert "b" not in state.wanted
    state, _ = coordinate(state, fleet, Wake("b", "gateway"), NOW + 2)
    assert c.held_for(state, "b", NOW + 2) == 58.0
    state, _ = coordinate(booted(fleet), replace(fleet, swaps_per_minute=None), Wake("b", "gateway"), NOW)
    assert c.held_for(state, "b", NOW) is None


def test_wakes_of_both_members_of_a_one_gpu_pair_take_turns() -> None:
    """Both asleep, wakes of both asked together (the gateway's burst): one is woken, the other waits while
    the first is waking (its view may still say asleep until its worker moves) and is woken only after the
    first was put to sleep again."""
    fleet = view({"a": (m.Stage.ASLEEP, 0.83), "b": (m.Stage.ASLEEP, 0.83)})
    state = booted(fleet)
    out: list[c.Directive] = []
    for _ in range(10):  # a burst of wakes of each, interleaved, before either worker has moved
        for name in ("a", "b"):
            state, more = coordinate(state, fleet, Wake(name, "gateway"), NOW)
            out += more
    assert wakes(out) == ["a"], "only one member of the pair is woken"
    state, out = coordinate(state, fleet, Look(), NOW + 1)
    assert wakes(out) == [], "a's wake is in flight: b still waits"
    fleet = at(fleet, "a", stage=m.Stage.WAKING)
    state, out = coordinate(state, fleet, Wake("b", "gateway"), NOW + 2)
    assert wakes(out) == sleeps(out) == []
    fleet = at(fleet, "a", stage=m.Stage.READY)
    state, out = coordinate(state, fleet, Look(), NOW + 3)
    assert wakes(out) == [] and sleeps(out) == ["a"], "a sleeps to make room for b"
    fleet = at(fleet, "a", stage=m.Stage.FALLING_ASLEEP)
    state, out = coordinate(state, fleet, Wake("a", "gateway"), NOW + 4)
    assert wakes(out) == []
    fleet = at(fleet, "a", stage=m.Stage.ASLEEP)
    state, out = coordinate(state, fleet, Wake("a", "gateway"), NOW + 5)
    assert wakes(out) == ["b"], "b's turn: a, just put to sleep for it, waits"
    state, out = coordinate(state, fleet, Look(), NOW + 6)
    assert wakes(out) == []


def test_a_wake_of_the_sleeper_while_the_awake_member_falls_asleep_for_it_waits() -> None:
    """a ready, b asleep; b wanted, a put to sleep; a wanted again meanwhile: once a is asleep only b wakes."""
    fleet = view({"a": (m.Stage.READY, 0.83), "b": (m.Stage.ASLEEP, 0.83)})
    state, out = coordinate(booted(fleet), fleet, Wake("b", "gateway"), NOW)
    assert sleeps(out) == ["a"]
    fleet = at(fleet, "a", stage=m.Stage.ASLEEP)
    state, out = coordinate(state, fleet, Wake("a", "gateway"), NOW + 1)
    assert wakes(out) == ["b"]
    state, out = coordinate(state, fleet, Wake("a", "gateway"), NOW + 2)
    assert wakes(out) == [] and "a" in state.wanted
