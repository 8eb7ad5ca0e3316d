"""The transition table: for every stage and event type, allowed (to which stages), refused or ignored.

The tests check `step` against it for every pair; docs/ARCHITECTURE.md's state table is rendered from it
(`make docs`: scripts/gen_state_table.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from dankserve.supervisor.machine.events import (
    EVENT_TYPES,
    Begin,
    BootLog,
    BootPlanned,
    Crashed,
    Event,
    Exited,
    FellAsleep,
    FreeMemoryRead,
    GpusAcquired,
    GpuTenants,
    HealthChecked,
    ImageReady,
    LauncherLost,
    LivenessFailed,
    LogEnded,
    MemberLost,
    PortBusy,
    PortFree,
    Reconfigured,
    Refused,
    Restored,
    RestoreFailed,
    RuntimeUnreachable,
    SleepFailed,
    SleepKeptMemory,
    SleepRequested,
    SleepUnsupported,
    SnapshotCaptured,
    SnapshotCaptureFailed,
    StillRunning,
    StopRequested,
    SuspendFailed,
    Tick,
    WakeFailed,
    WakeRequested,
    WarmedUp,
    WeightsFailed,
    WeightsProgress,
    WeightsReady,
    WokeUp,
    WokeWrong,
    WorkloadStarted,
)
from dankserve.supervisor.machine.stages import (
    SLEEP_STAGES,
    TERMINAL,
    Stage,
)

Kind = Literal["allowed", "refused", "ignored"]


@dataclass(frozen=True)
class Transition:
    """What an event does in a stage: allowed (to one of `to`), refused, or ignored."""

    kind: Kind
    to: tuple[Stage, ...] = ()
    note: str = ""


def _allowed(*to: Stage, note: str = "") -> Transition:
    return Transition("allowed", to, note)


IGNORED = Transition("ignored")
REFUSED = Transition("refused")
_ALL = tuple(Stage)
_RESTART = (Stage.DOWNLOADING, Stage.PULLING)
"""Where a new boot begins (downloading when dankserve fetches weights)."""
_ON_FAILURE = (Stage.DECIDING,)
_RECONFIGURE = _RESTART


def _transitions() -> dict[tuple[Stage, type[Event]], Transition]:
    t: dict[tuple[Stage, type[Event]], Transition] = {}
    for stage in _ALL:
        for kind in EVENT_TYPES:
            t[stage, kind] = REFUSED
        # Stop, reload and time are always possible.
        t[stage, StopRequested] = _allowed(Stage.STOPPED) if stage not in TERMINAL else IGNORED
        t[stage, Reconfigured] = _allowed(*_RECONFIGURE) if stage not in TERMINAL and stage != Stage.IDLE else IGNORED
        t[stage, Tick] = IGNORED
        # Lines and health answers of a workload being torn down may still arrive: harmless.
        for late in (BootLog, LogEnded, HealthChecked, WarmedUp, WeightsProgress, LivenessFailed, MemberLost):
            t[stage, late] = IGNORED
        # Any command may find the runtime gone, or hit a bug.
        t[stage, RuntimeUnreachable] = _allowed(Stage.RETRY_WAIT) if stage not in TERMINAL else IGNORED
        t[stage, Crashed] = _allowed(*_ON_FAILURE) if stage not in TERMINAL else IGNORED
        t[stage, Refused] = _allowed(Stage.FAILED) if stage not in TERMINAL else IGNORED
    t[Stage.IDLE, Begin] = _allowed(*_RESTART, Stage.ASLEEP, note="asleep: a swap member added by a reload")
    t[Stage.IDLE, RuntimeUnreachable] = REFUSED
    t[Stage.IDLE, Crashed] = REFUSED
    t[Stage.IDLE, Refused] = REFUSED
    t[Stage.DOWNLOADING, WeightsProgress] = _allowed(Stage.DOWNLOADING)
    t[Stage.DOWNLOADING, WeightsReady] = _allowed(Stage.PULLING)
    t[Stage.DOWNLOADING, WeightsFailed] = _allowed(Stage.FAILED, Stage.RETRY_WAIT)
    t[Stage.PULLING, ImageReady] = _allowed(Stage.PLANNING)
    t[Stage.PLANNING, BootPlanned] = _allowed(
        *(Stage.BOOTING, Stage.WAITING_GPUS, Stage.ASLEEP, Stage.FALLING_ASLEEP, Stage.WAKING),
        note="adopts a running workload (a swap member: asleep, or its sleep or wake finished again)",
    )
    t[Stage.WAITING_GPUS, GpusAcquired] = _allowed(Stage.MEASURING)
    t[Stage.MEASURING, FreeMemoryRead] = _allowed(Stage.MEASURING, Stage.STARTING)
    t[Stage.MEASURING, Tick] = _allowed(Stage.MEASURING, note="reads free memory again when due")
    t[Stage.STARTING, WorkloadStarted] = _allowed(Stage.BOOTING)
    t[Stage.STARTING, PortBusy] = _allowed(Stage.RETRY_WAIT)
    # launcher
    t[Stage.STARTING, LauncherLost] = _allowed(Stage.STARTING, note="replaces the launcher")
    for stage in (Stage.BOOTING, Stage.READY):
        t[stage, BootLog] = _allowed(stage, Stage.ENDING)
        # Both look around (running.watch), which may find a boot past its deadline: a boot timeout.
        t[stage, LogEnded] = _allowed(stage, *_ON_FAILURE)
        t[stage, Exited] = _allowed(*_ON_FAILURE)
        t[stage, StillRunning] = _allowed(stage)
        t[stage, HealthChecked] = (
            _allowed(Stage.READY, Stage.WAKING, *_ON_FAILURE)
            if stage == Stage.READY
            else _allowed(Stage.BOOTING, note="up: the warm-up before ready is sent")
        )
        t[stage, Tick] = _allowed(stage, *_ON_FAILURE)
        t[stage, RuntimeUnreachable] = _allowed(stage, *_ON_FAILURE, note="follows on; the server is still probed")
        t[stage, MemberLost] = _allowed(*_ON_FAILURE)
    t[Stage.BOOTING, WarmedUp] = _allowed(
        Stage.READY, *_ON_FAILURE, Stage.BOOTING, note="a failed warm-up fails the boot; unasked: nothing"
    )
    t[Stage.READY, LivenessFailed] = _allowed(*_ON_FAILURE)
    t[Stage.ENDING, Exited] = _allowed(*_ON_FAILURE)
    t[Stage.ENDING, StillRunning] = _allowed(*_ON_FAILURE)
    t[Stage.DECIDING, GpuTenants] = _allowed(Stage.BACKOFF, Stage.FAILED, Stage.ASLEEP, note="its server died asleep")
    t[Stage.BACKOFF, Tick] = _allowed(Stage.BACKOFF, *_RESTART)
    t[Stage.RETRY_WAIT, Tick] = _allowed(Stage.RETRY_WAIT, *_RESTART)
    t[Stage.RETRY_WAIT, PortBusy] = _allowed(Stage.RETRY_WAIT, note="looks at the port again")
    t[Stage.RETRY_WAIT, PortFree] = _allowed(*_RESTART)
    _swap_transitions(t)
    _snapshot_transitions(t)
    for stage in TERMINAL:
        for kind in EVENT_TYPES:
            if t[stage, kind] is REFUSED:
                t[stage, kind] = IGNORED  # a finished worker drops what still comes in
    return t


def _swap_transitions(t: dict[tuple[Stage, type[Event]], Transition]) -> None:
    """Swap groups (issue 16): sleeping and waking a ready server."""
    for stage in _ALL:
        # The coordinator asks from its own view, which may be a moment old: a request that
        # does not fit the stage (already asleep, still booting) changes nothing.
        t[stage, SleepRequested] = IGNORED
        t[stage, WakeRequested] = IGNORED
    t[Stage.READY, SleepRequested] = _allowed(Stage.FALLING_ASLEEP)
    t[Stage.FALLING_ASLEEP, WakeRequested] = _allowed(Stage.FALLING_ASLEEP, note="wakes once asleep")
    t[Stage.FALLING_ASLEEP, FellAsleep] = _allowed(Stage.ASLEEP, Stage.WAKING, *_RESTART, note="a wake was asked")
    t[Stage.FALLING_ASLEEP, SuspendFailed] = _allowed(Stage.ASLEEP, Stage.WAKING, *_RESTART, note="level 1 instead")
    t[Stage.FALLING_ASLEEP, SleepUnsupported] = _allowed(Stage.FALLING_ASLEEP, note="stopped instead")
    t[Stage.FALLING_ASLEEP, SleepFailed] = _allowed(*_ON_FAILURE)
    t[Stage.FALLING_ASLEEP, SleepKeptMemory] = _allowed(Stage.FALLING_ASLEEP, note="stopped instead")
    t[Stage.ASLEEP, WakeRequested] = _allowed(Stage.WAKING, *_RESTART, note="stop: boots")
    t[Stage.ASLEEP, Reconfigured] = _allowed(*_RECONFIGURE, Stage.ASLEEP, note="a swap member stays asleep, by stop")
    t[Stage.WAKING, WokeUp] = _allowed(Stage.READY)
    t[Stage.WAKING, WakeFailed] = _allowed(*_ON_FAILURE)
    t[Stage.WAKING, WokeWrong] = _allowed(Stage.FALLING_ASLEEP, note="stopped, then booted")
    for stage in SLEEP_STAGES:
        # The server still runs (unless stopped to sleep): it may die meanwhile.
        t[stage, LogEnded] = _allowed(stage)
        t[stage, Exited] = _allowed(*_ON_FAILURE, stage, note="stop: nothing ran")
        t[stage, StillRunning] = _allowed(stage)


def _snapshot_transitions(t: dict[tuple[Stage, type[Event]], Transition]) -> None:
    """Snapshots (issue 41): a ready server captured, a boot restored instead of started."""
    t[Stage.READY, Tick] = _allowed(Stage.READY, *_ON_FAILURE, Stage.SNAPSHOTTING, note="a capture due")
    t[Stage.SNAPSHOTTING, SnapshotCaptured] = _allowed(Stage.READY)
    t[Stage.SNAPSHOTTING, SnapshotCaptureFailed] = _allowed(
        Stage.READY, Stage.DOWNLOADING, Stage.PULLING, note="undone: serving; or the server lost: a normal boot"
    )
    t[Stage.SNAPSHOTTING, Exited] = _allowed(*_ON_FAILURE)
    t[Stage.STARTING, Restored] = _allowed(Stage.READY)
    t[Stage.STARTING, RestoreFailed] = _allowed(Stage.MEASURING, note="the normal boot, no failure counted")


TRANSITIONS: Mapping[tuple[Stage, type[Event]], Transition] = _transitions()
