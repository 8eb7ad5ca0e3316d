"""The upgrade machine: each path from pull to switch, refusal or rollback, and recovery after kill -9."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from dankserve.supervisor.upgrade import (
    Action,
    BootNew,
    Event,
    MakeRoom,
    Measure,
    Measured,
    Measurement,
    MeasureOld,
    NewBooted,
    NewFailed,
    NewStopped,
    OldMeasured,
    OldRestored,
    OldStopped,
    Pull,
    Pulled,
    PullFailed,
    PullProgressed,
    ReadVersion,
    Replan,
    Replanned,
    RestoreOld,
    RoomMade,
    Step,
    StopNew,
    StopOld,
    UpgradeState,
    VersionRead,
    advance,
    begin,
    recover,
)

GOOD = Measurement(100_000, 50.0, (1, 2, 3))


def feed(state: UpgradeState, *events: Event) -> tuple[UpgradeState, Sequence[Action]]:
    actions: Sequence[Action] = ()
    for event in events:
        state, actions = advance(state, event)
    return state, actions


def booted() -> UpgradeState:
    state, _ = begin("chat", "img:old", "img:new", 10.0, old_version="0.26.0")
    state, _ = feed(
        state,
        Pulled("sha256:n"),
        VersionRead("0.27.0"),
        Replanned(()),
        OldMeasured(GOOD),
        RoomMade("1", "host RAM holds the weights"),
        NewBooted("w-new"),
    )
    return state


def test_the_steps_come_in_order_with_their_actions() -> None:
    """pull, version, re-plan, measure the old, make room, boot, check, each asking for the next action."""
    state, actions = begin("chat", "img:old", "img:new", 10.0)
    assert (state.step, actions) == (Step.PULLING, (Pull("img:new"),))
    state, actions = advance(state, PullProgressed(40.0))
    assert state.pull_percent == 40.0 and actions == ()
    state, actions = advance(state, Pulled("sha256:n"))
    assert (state.step, actions) == (Step.READING_VERSION, (ReadVersion("img:new"),))
    state, actions = advance(state, VersionRead("0.27.0"))
    assert (state.step, actions) == (Step.REPLANNING, (Replan("img:new", "0.27.0"),))
    state, actions = advance(state, Replanned(()))
    assert (state.step, actions) == (Step.MAKING_ROOM, (MeasureOld(),))
    state, actions = advance(state, OldMeasured(GOOD))
    assert actions == (MakeRoom(),)
    state, actions = advance(state, RoomMade("1", "fits"))
    assert (state.step, state.room, actions) == (Step.BOOTING, "1", (BootNew("img:new", "0.27.0"),))
    state, actions = advance(state, NewBooted("w-new"))
    assert (state.step, actions) == (Step.CHECKING, (Measure("w-new"),))


def test_a_new_server_no_worse_switches_and_stops_the_old() -> None:
    """Checks passed: switching stops the old server; its stop ends the upgrade switched."""
    state, actions = advance(booted(), Measured(GOOD))
    assert (state.step, actions) == (Step.SWITCHING, (StopOld(),))
    state, _ = advance(state, OldStopped())
    assert state.step is Step.SWITCHED and state.to_record().serving_image == "img:new"


@pytest.mark.parametrize(
    ("new", "words"),
    [(Measurement(80_000, 50.0, (1, 2, 3)), "KV cache shrank"), (Measurement(100_000, 30.0, (1,)), "slower")],
)
def test_a_regression_rolls_back_stopping_the_new_then_waking_the_old(new: Measurement, words: str) -> None:
    """A shrunk KV cache or slower decode: stop the new server, wake the old at its level, rolled back."""
    state, actions = advance(booted(), Measured(new))
    assert state.step is Step.ROLLING_BACK and words in (state.reason or "")
    assert actions == (StopNew("w-new"), RestoreOld("1"))
    state, _ = feed(state, NewStopped(), OldRestored())
    assert state.step is Step.ROLLED_BACK and state.to_record().serving_image == "img:old"


def test_a_boot_failure_rolls_back_removing_the_failed_server() -> None:
    """The new server exits during boot: its workload is removed and the old one restored."""
    state, _ = begin("chat", "img:old", "img:new", 0.0)
    state, _ = feed(state, Pulled(None), VersionRead("0.27.0"), Replanned(()), OldMeasured(GOOD))
    state, _ = advance(state, RoomMade("stop", "host RAM is short"))
    state, actions = advance(state, NewFailed("exited with 1", "w-bad"))
    assert "did not boot: exited with 1" in (state.reason or "")
    assert actions == (StopNew("w-bad"), RestoreOld("stop"))


def test_a_gone_flag_refuses_before_the_old_server_is_touched() -> None:
    """A planned flag the release lacks: refused with the flag named, no action on the old server."""
    state, _ = begin("chat", "img:old", "img:new", 0.0)
    state, actions = feed(state, Pulled(None), VersionRead("0.27.0"), Replanned(("--old-flag",)))
    assert state.step is Step.REFUSED and actions == ()
    assert "vLLM 0.27.0 does not accept the planned flag(s) --old-flag" in (state.reason or "")


def test_a_failed_pull_refuses() -> None:
    """The pull's failure is the reason."""
    state, _ = begin("chat", "img:old", "img:new", 0.0)
    state, _ = advance(state, PullFailed("manifest unknown"))
    assert state.step is Step.REFUSED and "manifest unknown" in (state.reason or "")


def test_an_event_a_step_does_not_expect_changes_nothing() -> None:
    """A late boot answer while pulling leaves the state as it was."""
    state, _ = begin("chat", "img:old", "img:new", 0.0)
    assert advance(state, NewBooted("w")) == (state, ())


@pytest.mark.parametrize("step", [Step.PULLING, Step.READING_VERSION, Step.REPLANNING])
def test_recovery_before_making_room_leaves_the_old_server_serving(step: Step) -> None:
    """Killed before the old server was touched: nothing to undo, recorded rolled back with why."""
    state, _ = begin("chat", "img:old", "img:new", 0.0)
    state, actions = recover(state.at(step))
    assert state.step is Step.ROLLED_BACK and actions == () and step.value in (state.reason or "")


@pytest.mark.parametrize(("step", "room"), [(Step.MAKING_ROOM, None), (Step.BOOTING, "1"), (Step.CHECKING, "stop")])
def test_recovery_after_room_was_made_stops_the_new_server_first(step: Step, room: str | None) -> None:
    """Killed with a new server possibly running: stop it (by label when no id), then restore the old."""
    state, _ = begin("chat", "img:old", "img:new", 0.0)
    state, actions = recover(state.at(step, room=room))
    assert state.step is Step.ROLLING_BACK
    assert actions == (StopNew(None), RestoreOld(room or "stop"))


def test_recovery_while_switching_finishes_the_switch() -> None:
    """Checks had passed: the next daemon stops the old server and records the switch."""
    state, _ = advance(booted(), Measured(GOOD))
    again, actions = recover(state)
    assert again.step is Step.SWITCHING and actions == (StopOld(),)


def test_the_record_round_trips_through_state_json_form() -> None:
    """to_record / from_record keep step, images, versions, room and workload."""
    state = booted()
    back = UpgradeState.from_record("chat", state.to_record())
    assert (back.step, back.old_image, back.new_version, back.room, back.new_workload) == (
        Step.CHECKING,
        "img:old",
        "0.27.0",
        "1",
        "w-new",
    )


def test_an_auto_update_finding_the_same_digest_ends_up_to_date() -> None:
    """if_newer: the pulled digest equal to the running one refuses as up to date; another digest goes on."""
    state, _ = begin("chat", "img", "img", 0.0, old_digest="sha256:a", if_newer=True)
    same, actions = advance(state, Pulled("sha256:a"))
    assert same.step is Step.REFUSED and (same.reason or "").startswith("up to date") and actions == ()
    newer, _ = advance(state, Pulled("sha256:b"))
    assert newer.step is Step.READING_VERSION
