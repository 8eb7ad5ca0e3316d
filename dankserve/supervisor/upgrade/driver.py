"""The upgrade's edge: run each action through an `UpgradeEdge`, feed its answer back, record every
step (state.json, status, the log) before the action that belongs to it is taken."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog

from dankserve.supervisor.upgrade.actions import (
    Action,
    BootNew,
    MakeRoom,
    Measure,
    MeasureOld,
    Pull,
    ReadVersion,
    Replan,
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
from dankserve.supervisor.upgrade.steps import UpgradeState
from dankserve.supervisor.upgrade.transitions import advance

log = structlog.get_logger("dankserve.upgrade")


class UpgradeEdge(Protocol):
    """What an upgrade asks of the daemon: one method per action, each answering with its event."""

    def pull(self, image: str, progress: Callable[[float], None]) -> Pulled | PullFailed: ...

    def read_version(self, image: str) -> VersionRead: ...

    def replan(self, image: str, version: str | None) -> Replanned: ...

    def measure_old(self) -> OldMeasured: ...

    def make_room(self) -> RoomMade: ...

    def boot_new(self, image: str, version: str | None) -> NewBooted | NewFailed: ...

    def measure_new(self, workload: str) -> Measured | NewFailed: ...

    def stop_old(self) -> OldStopped: ...

    def stop_new(self, workload: str | None) -> NewStopped: ...

    def restore_old(self, room: str | None) -> OldRestored: ...


def _answer(edge: UpgradeEdge, action: Action, progress: Callable[[float], None]) -> Event:
    if isinstance(action, Pull):
        return edge.pull(action.image, progress)
    if isinstance(action, ReadVersion):
        return edge.read_version(action.image)
    if isinstance(action, Replan):
        return edge.replan(action.image, action.version)
    if isinstance(action, MeasureOld):
        return edge.measure_old()
    if isinstance(action, MakeRoom):
        return edge.make_room()
    if isinstance(action, BootNew):
        return edge.boot_new(action.image, action.version)
    if isinstance(action, Measure):
        return edge.measure_new(action.workload)
    if isinstance(action, StopOld):
        return edge.stop_old()
    if isinstance(action, StopNew):
        return edge.stop_new(action.workload)
    return edge.restore_old(action.room)


def drive(
    state: UpgradeState,
    actions: Sequence[Action],
    edge: UpgradeEdge,
    record: Callable[[UpgradeState], None],
) -> UpgradeState:
    """Run the upgrade to its end; `record` is called with every new state (before its actions run)."""
    record(state)
    log.info("upgrade_step", deployment=state.deployment, step=state.step.value, image=state.new_image)
    pending: deque[Action] = deque(actions)

    logged = -10.0

    def progress(percent: float) -> None:
        nonlocal state, logged
        state, _ = advance(state, PullProgressed(percent))
        record(state)
        if percent >= logged + 10 or percent >= 100 > logged:  # the log every 10 %, status every report
            logged = percent
            log.info("upgrade_pull", deployment=state.deployment, image=state.new_image, percent=percent)

    while pending:
        action = pending.popleft()
        event = _answer(edge, action, progress)
        after, more = advance(state, event)
        if after is state:
            log.warning("upgrade_event_ignored", deployment=state.deployment, step=state.step.value, event=repr(event))
            continue
        moved = after.step is not state.step
        state = after
        record(state)
        if moved:
            log.info(
                "upgrade_step",
                deployment=state.deployment,
                step=state.step.value,
                room=state.room,
                new_version=state.new_version,
                reason=state.reason,
            )
        pending.extend(more)
    return state
