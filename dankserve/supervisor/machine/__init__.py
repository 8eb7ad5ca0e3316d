"""A deployment's lifecycle as one pure state machine: `step(state, event, now) -> (state, commands)`.

The worker thread (`supervisor.worker.DeploymentWorker`) is only an interpreter: it runs the
commands through the runtime, the state store and NVML, and turns what happens (a command's
result, a log line, a health answer, a timer, a stop or reload request) into events. Every
decision lives in this package and in the pure pieces it calls: `policy.restart_or_give_up`
(whether a failure, an unavailable service or a refusal boots again, and when),
`learning.decide_kv_reuse` (the learned-bytes guard) and `lifecycle.advance_boot_phase` (boot
phases only move forward). `now` is the interpreter's
monotonic clock in seconds; nothing here reads a clock, a file or a socket.

`TRANSITIONS` declares, for every stage and event type, whether the event is allowed (and the
stages it may lead to), refused (it cannot happen there: the state stays, a warning is logged)
or ignored (it may happen there and changes nothing, e.g. a late timer). The tests check `step`
against it for every pair; docs/ARCHITECTURE.md's state table is rendered from it (`make docs`:
scripts/gen_state_table.py).

How producers outside this package feed events: a weights download (issue 14) answers
`EnsureWeights` with `WeightsProgress(percent)` events and then `WeightsReady` (or
`WeightsFailed`); a liveness probe (issue 17) feeds `LivenessFailed(cause, message)` while the
server is ready; a multi-host group feeds `MemberLost(reason)` when a member is gone.

The launcher (issue 15; grouped under "launcher" below): a deployment with `launcher = true` runs
a launcher workload (a container or process that pre-imports vLLM) whose servers come and go. A
boot then carries the launcher's server number (`Boot.server`); its failures, `down` and reloads
stop only that server (`StopServer`), and the next boot asks the same launcher for a new one
(`StartWorkload.launcher_id`) when planning found it running with this boot's container-level
settings (`ExistingWorkload.launcher`). A launcher that does not answer (`LauncherLost`) is
replaced; a changed image, GPU set, mounts or ports replace it; SIGTERM removes it.

The package, the way h11 keeps its vocabulary apart from its driver: `stages` (the stages and what
status shows of them), `state` (`MachineState` and its parts), `events`, `commands`, `transitions`
(the table), `timing` (the timers), the handlers by concern (`booting`, `running`, `deciding`,
`swapping`, with what several share in `outcomes`), and `driver` (`step`). Callers import the names
from the package.
"""

from dankserve.supervisor.machine.booting import (
    found_asleep,
    kv_decision,
    unfinished_swap,
)
from dankserve.supervisor.machine.commands import (
    AcquireGpus,
    CheckPort,
    Command,
    CountGpuTenants,
    EnsureImage,
    EnsureWeights,
    FollowLogs,
    ForgetLearned,
    MarkSleepUnsafe,
    Note,
    PlanBoot,
    ProbeHealth,
    ReadFreeMemory,
    RecordBoot,
    RecordFailure,
    RecordRestart,
    ReleaseGpus,
    RemoveLauncher,
    RemoveWorkload,
    SetRemediation,
    SleepServer,
    StartWorkload,
    StopServer,
    StopWorkload,
    WaitExit,
    WakeServer,
    WarmUp,
    note,
)
from dankserve.supervisor.machine.driver import (
    step,
)
from dankserve.supervisor.machine.events import (
    EVENT_TYPES,
    Begin,
    BootLog,
    BootPlanned,
    Crashed,
    Event,
    ExistingWorkload,
    Exited,
    FellAsleep,
    FreeMemoryRead,
    GpusAcquired,
    GpuTenants,
    HealthChecked,
    ImageReady,
    LauncherFound,
    LauncherLost,
    LivenessFailed,
    LogEnded,
    MemberLost,
    PortBusy,
    PortFree,
    Reconfigured,
    Refused,
    RuntimeUnreachable,
    SleepFailed,
    SleepKeptMemory,
    SleepRequested,
    SleepUnsupported,
    StillRunning,
    StopRequested,
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
from dankserve.supervisor.machine.stages import (
    BOOT_PHASES,
    PREPARING,
    RUNNING,
    SLEEP_LEVELS,
    SLEEP_STAGES,
    SWAP_MOVES,
    TERMINAL,
    SleepLevel,
    Stage,
    StatusState,
    SwapMove,
)
from dankserve.supervisor.machine.state import (
    Boot,
    BootOverrides,
    Failure,
    LastFailure,
    MachineConfig,
    MachineState,
    Outage,
    SleepRecord,
    SwapTimes,
    initial_state,
)
from dankserve.supervisor.machine.timing import (
    EXIT_WAIT_SECONDS,
    FREE_MEMORY_RETRY_SECONDS,
    HEALTH_RETRY_SECONDS,
    MAX_IDLE_SECONDS,
    PORT_RECHECK_SECONDS,
    UNANSWERED_HEALTH_MESSAGE,
    UNANSWERED_HEALTH_SECONDS,
    WARM_UP_TIMEOUT_SECONDS,
)
from dankserve.supervisor.machine.transitions import (
    IGNORED,
    REFUSED,
    TRANSITIONS,
    Kind,
    Transition,
)

__all__ = [
    "BOOT_PHASES",
    "EVENT_TYPES",
    "EXIT_WAIT_SECONDS",
    "FREE_MEMORY_RETRY_SECONDS",
    "HEALTH_RETRY_SECONDS",
    "IGNORED",
    "MAX_IDLE_SECONDS",
    "PORT_RECHECK_SECONDS",
    "PREPARING",
    "REFUSED",
    "RUNNING",
    "SLEEP_LEVELS",
    "SLEEP_STAGES",
    "SWAP_MOVES",
    "TERMINAL",
    "TRANSITIONS",
    "UNANSWERED_HEALTH_MESSAGE",
    "UNANSWERED_HEALTH_SECONDS",
    "WARM_UP_TIMEOUT_SECONDS",
    "AcquireGpus",
    "Begin",
    "Boot",
    "BootLog",
    "BootOverrides",
    "BootPlanned",
    "CheckPort",
    "Command",
    "CountGpuTenants",
    "Crashed",
    "EnsureImage",
    "EnsureWeights",
    "Event",
    "ExistingWorkload",
    "Exited",
    "Failure",
    "FellAsleep",
    "FollowLogs",
    "ForgetLearned",
    "FreeMemoryRead",
    "GpuTenants",
    "GpusAcquired",
    "HealthChecked",
    "ImageReady",
    "Kind",
    "LastFailure",
    "LauncherFound",
    "LauncherLost",
    "LivenessFailed",
    "LogEnded",
    "MachineConfig",
    "MachineState",
    "MarkSleepUnsafe",
    "MemberLost",
    "Note",
    "Outage",
    "PlanBoot",
    "PortBusy",
    "PortFree",
    "ProbeHealth",
    "ReadFreeMemory",
    "Reconfigured",
    "RecordBoot",
    "RecordFailure",
    "RecordRestart",
    "Refused",
    "ReleaseGpus",
    "RemoveLauncher",
    "RemoveWorkload",
    "RuntimeUnreachable",
    "SetRemediation",
    "SleepFailed",
    "SleepKeptMemory",
    "SleepLevel",
    "SleepRecord",
    "SleepRequested",
    "SleepServer",
    "SleepUnsupported",
    "Stage",
    "StartWorkload",
    "StatusState",
    "Step",
    "StillRunning",
    "StopRequested",
    "StopServer",
    "StopWorkload",
    "SwapMove",
    "SwapTimes",
    "Tick",
    "Transition",
    "WaitExit",
    "WakeFailed",
    "WakeRequested",
    "WakeServer",
    "WarmUp",
    "WarmedUp",
    "WeightsFailed",
    "WeightsProgress",
    "WeightsReady",
    "WokeUp",
    "WokeWrong",
    "WorkloadStarted",
    "found_asleep",
    "initial_state",
    "kv_decision",
    "note",
    "step",
    "unfinished_swap",
]
