"""The driver: `step(state, event, now)` looks the event up in the table and runs its handler."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dankserve.supervisor.machine.booting import (
    on_begin,
    on_boot_planned,
    on_free_memory,
    on_gpus_acquired,
    on_image_ready,
    on_launcher_lost,
    on_port_busy,
    on_port_free,
    on_reconfigured,
    on_stop,
    on_weights_failed,
    on_weights_progress,
    on_weights_ready,
    on_workload_started,
)
from dankserve.supervisor.machine.commands import (
    note,
)
from dankserve.supervisor.machine.deciding import (
    on_gpu_tenants,
)
from dankserve.supervisor.machine.events import (
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
from dankserve.supervisor.machine.outcomes import (
    Step,
)
from dankserve.supervisor.machine.running import (
    on_boot_log,
    on_crashed,
    on_exited,
    on_health,
    on_liveness,
    on_log_ended,
    on_member_lost,
    on_refused,
    on_still_running,
    on_tick,
    on_unreachable,
    on_warmed_up,
)
from dankserve.supervisor.machine.snapshots import (
    on_capture_failed,
    on_restore_failed,
    on_restored,
    on_snapshot_captured,
)
from dankserve.supervisor.machine.state import (
    MachineState,
)
from dankserve.supervisor.machine.swapping import (
    on_fell_asleep,
    on_sleep_kept_memory,
    on_sleep_requested,
    on_sleep_unsupported,
    on_suspend_failed,
    on_swap_failed,
    on_wake_requested,
    on_woke_up,
    on_woke_wrong,
)
from dankserve.supervisor.machine.transitions import (
    TRANSITIONS,
)

_HANDLERS: dict[type, Callable[[MachineState, Any, float], Step]] = {
    Begin: on_begin,
    StopRequested: on_stop,
    Reconfigured: on_reconfigured,
    Tick: on_tick,
    WeightsProgress: on_weights_progress,
    WeightsReady: on_weights_ready,
    WeightsFailed: on_weights_failed,
    ImageReady: on_image_ready,
    BootPlanned: on_boot_planned,
    GpusAcquired: on_gpus_acquired,
    FreeMemoryRead: on_free_memory,
    PortBusy: on_port_busy,
    PortFree: on_port_free,
    WorkloadStarted: on_workload_started,
    BootLog: on_boot_log,
    LogEnded: on_log_ended,
    Exited: on_exited,
    StillRunning: on_still_running,
    HealthChecked: on_health,
    WarmedUp: on_warmed_up,
    LivenessFailed: on_liveness,
    MemberLost: on_member_lost,
    GpuTenants: on_gpu_tenants,
    RuntimeUnreachable: on_unreachable,
    Refused: on_refused,
    Crashed: on_crashed,
    LauncherLost: on_launcher_lost,
    SleepRequested: on_sleep_requested,
    FellAsleep: on_fell_asleep,
    SuspendFailed: on_suspend_failed,
    SleepUnsupported: on_sleep_unsupported,
    SleepFailed: on_swap_failed,
    SleepKeptMemory: on_sleep_kept_memory,
    WakeRequested: on_wake_requested,
    WokeUp: on_woke_up,
    WokeWrong: on_woke_wrong,
    WakeFailed: on_swap_failed,
    SnapshotCaptured: on_snapshot_captured,
    SnapshotCaptureFailed: on_capture_failed,
    Restored: on_restored,
    RestoreFailed: on_restore_failed,
}


def step(state: MachineState, event: Event, now: float) -> Step:
    """The state after `event` at `now`, and the commands the interpreter must run (in order)."""
    rule = TRANSITIONS[state.stage, type(event)]
    if rule.kind == "ignored":
        return state, ()
    if rule.kind == "refused":
        return state, (note("event_refused", "warning", stage=state.stage.value, received=type(event).__name__),)
    return _HANDLERS[type(event)](state, event, now)
