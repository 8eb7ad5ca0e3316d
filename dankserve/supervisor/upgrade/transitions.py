"""The upgrade's decisions: `begin`, `advance(state, event) -> (state, actions)` and `recover`.

Pure: no clock (the driver passes `now` to `begin`), no I/O. An event a step does not expect
changes nothing (the driver logs it): a late answer cannot move an upgrade that has moved on."""

from __future__ import annotations

from collections.abc import Sequence

from dankserve.supervisor.upgrade.actions import (
    Action,
    BootNew,
    MakeRoom,
    Measure,
    MeasureOld,
    Pull,
    ReadVersion,
    Replan,
    RestoreOld,
    StopNew,
    StopOld,
)
from dankserve.supervisor.upgrade.events import (
    Event,
    Measured,
    NewBooted,
    NewFailed,
    NewStopped,
    OldMeasured,
    OldRestored,
    OldStopped,
    Pulled,
    PullFailed,
    PullProgressed,
    Replanned,
    RoomMade,
    VersionRead,
)
from dankserve.supervisor.upgrade.judging import DEFAULT_LIMITS, Limits, judge
from dankserve.supervisor.upgrade.steps import BEFORE_ROOM, Step, UpgradeState

Outcome = tuple[UpgradeState, Sequence[Action]]


def begin(
    deployment: str,
    old_image: str,
    new_image: str,
    now: float,
    *,
    old_version: str | None = None,
    limits: Limits = DEFAULT_LIMITS,
    old_digest: str | None = None,
    if_newer: bool = False,
) -> Outcome:
    """A new upgrade: pull first. `if_newer` (auto-update): only when the pulled digest differs from `old_digest`."""
    state = UpgradeState(
        deployment,
        old_image,
        new_image,
        now,
        old_version=old_version,
        limits=limits,
        old_digest=old_digest,
        if_newer=if_newer,
    )
    return state, (Pull(new_image),)


def _roll_back(state: UpgradeState, reason: str, workload: str | None) -> Outcome:
    """Stop the new server (when one was started), then give the old one back its GPU."""
    after = state.at(Step.ROLLING_BACK, reason=reason, new_workload=workload)
    return after, (StopNew(workload), RestoreOld(state.room))


def _replanned(state: UpgradeState, event: Replanned) -> Outcome:
    release = f"vLLM {state.new_version}" if state.new_version else "the new image's vLLM"
    if event.problem is not None:
        return state.at(Step.REFUSED, reason=f"the plan fails on {release}: {event.problem}"), ()
    if event.gone:
        names = ", ".join(event.gone)
        return state.at(
            Step.REFUSED,
            reason=f"{release} does not accept the planned flag(s) {names} (gone or renamed): "
            "pin the image, or drop them from extra_args",
        ), ()
    return state.at(Step.MAKING_ROOM, report={"plan_changes": list(event.changes)}), (MeasureOld(),)


def _measured(state: UpgradeState, event: Measured) -> Outcome:
    old = state.old_measurement
    if old is None:  # no figures of the old server: only "it answers" can be checked
        verdict_reasons: tuple[str, ...] = ()
        report = {"new": event.new.to_json()}
    else:
        verdict = judge(old, event.new, state.limits)
        verdict_reasons, report = verdict.reasons, verdict.report
    report = {**state.report, **report}  # the re-plan's changes stay beside the figures
    if verdict_reasons:
        rolled, actions = _roll_back(state, "; ".join(verdict_reasons), state.new_workload)
        return rolled.at(Step.ROLLING_BACK, report=report), actions
    return state.at(Step.SWITCHING, report=report), (StopOld(),)


def advance(state: UpgradeState, event: Event) -> Outcome:
    """The upgrade after one event, and what to do next."""
    step = state.step
    if step is Step.PULLING:
        if isinstance(event, PullProgressed):
            return state.at(step, pull_percent=event.percent), ()
        if isinstance(event, Pulled):
            if state.if_newer and event.digest is not None and event.digest == state.old_digest:
                return state.at(
                    Step.REFUSED, pull_percent=None, reason=f"up to date: {state.new_image} is {event.digest}"
                ), ()
            return state.at(Step.READING_VERSION, pull_percent=None), (ReadVersion(state.new_image),)
        if isinstance(event, PullFailed):
            return state.at(Step.REFUSED, reason=f"pulling {state.new_image} failed: {event.reason}"), ()
    elif step is Step.READING_VERSION and isinstance(event, VersionRead):
        return state.at(Step.REPLANNING, new_version=event.version), (Replan(state.new_image, event.version),)
    elif step is Step.REPLANNING and isinstance(event, Replanned):
        return _replanned(state, event)
    elif step is Step.MAKING_ROOM:
        if isinstance(event, OldMeasured):
            return state.at(step, old_measurement=event.measurement), (MakeRoom(),)
        if isinstance(event, RoomMade):
            return state.at(Step.BOOTING, room=event.room), (BootNew(state.new_image, state.new_version),)
    elif step is Step.BOOTING:
        if isinstance(event, NewBooted):
            return state.at(Step.CHECKING, new_workload=event.workload), (Measure(event.workload),)
        if isinstance(event, NewFailed):
            return _roll_back(state, f"the new server did not boot: {event.reason}", event.workload)
    elif step is Step.CHECKING:
        if isinstance(event, Measured):
            return _measured(state, event)
        if isinstance(event, NewFailed):
            return _roll_back(state, f"the new server does not answer: {event.reason}", state.new_workload)
    elif step is Step.SWITCHING and isinstance(event, OldStopped):
        return state.at(Step.SWITCHED), ()
    elif step is Step.ROLLING_BACK:
        if isinstance(event, NewStopped):
            return state.at(step, new_workload=None), ()
        if isinstance(event, OldRestored):
            return state.at(Step.ROLLED_BACK), ()
    return state, ()


def recover(state: UpgradeState) -> Outcome:
    """What a daemon following one killed mid-upgrade does: finish a switch that was under way, undo
    anything else. Never two servers beyond the plan: the new one (found by its upgrade label when
    its id was not recorded yet) is stopped before the old one gets its GPU back."""
    if state.done:
        return state, ()
    if state.step is Step.SWITCHING:
        return state, (StopOld(),)
    if state.step in BEFORE_ROOM:
        why = f"interrupted while {state.step.value}: the old server kept serving"
        return state.at(Step.ROLLED_BACK, reason=why), ()
    reason = state.reason if state.step is Step.ROLLING_BACK else f"interrupted while {state.step.value}"
    # MAKING_ROOM without a recorded room: the old server may be asleep, stopped or serving; restoring
    # it as stopped boots it again through its worker, which adopts it when it still runs.
    return state.at(Step.ROLLING_BACK, reason=reason), (StopNew(state.new_workload), RestoreOld(state.room or "stop"))
