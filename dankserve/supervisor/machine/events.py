"""The events the interpreter feeds the machine: what happened (a result, a log line, a timer, a request)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from dankserve.bootlog.facts import BootFacts
from dankserve.state import LearnedKv
from dankserve.supervisor.lifecycle import Phase
from dankserve.supervisor.machine.stages import (
    SleepLevel,
    SwapMove,
)
from dankserve.supervisor.machine.state import (
    MachineConfig,
    SnapshotPlan,
)
from dankserve.supervisor.policy import FailureCause


@dataclass(frozen=True)
class Begin:
    """The worker starts."""

    asleep: bool = False
    """A swap member added by a reload to a group already running: it joins asleep (stop), no boot until asked."""


@dataclass(frozen=True)
class StopRequested:
    """`dankserve down`, SIGTERM, or the deployment removed from the configuration."""

    keep_launcher: bool = False
    """`dankserve down`: stop the server but keep its launcher for the next `up` (SIGTERM: remove it)."""


@dataclass(frozen=True)
class Reconfigured:
    """The deployment's configuration changed: boot again with it, forgetting remediations."""

    config: MachineConfig
    swap_member: bool = False
    """It is in a swap group (after the change): asleep, it stays asleep (by stop) and boots on its next request."""


@dataclass(frozen=True)
class Tick:
    """Time passed (`wake_at` reached, or the interpreter looked around)."""


@dataclass(frozen=True)
class WeightsProgress:
    """Downloading the weights: percent done (issue 14's downloader feeds these)."""

    percent: int


@dataclass(frozen=True)
class WeightsReady:
    """The weights are in the HF cache."""


@dataclass(frozen=True)
class WeightsFailed:
    """The download failed: `permanent` (no such model, gated) fails the deployment; otherwise retried."""

    message: str
    permanent: bool


@dataclass(frozen=True)
class ImageReady:
    vllm_version: str | None
    digest: str | None = None
    """The image's digest (the process runtime's executable identity): part of the learning key."""
    entrypoint: tuple[str, ...] | None = None
    """The image's entrypoint as read from its config (Podman; None: not read): `launcher = "auto"` decides by it."""


@dataclass(frozen=True)
class ExistingWorkload:
    """A workload of this deployment found before booting (left by an earlier daemon, or an earlier boot)."""

    id: str
    running: bool
    same_plan: bool
    """Its plan fingerprint is this boot's (so it may be adopted); a launcher's: its server's."""
    launcher: LauncherFound | None = None
    """The workload is a launcher: what it runs, and whether this boot may use it."""


@dataclass(frozen=True)
class LauncherFound:
    """A launcher workload found while planning."""

    reusable: bool
    """It answers, speaks this daemon's protocol version, and its container-level settings (image, GPUs,
    mounts, ports ...) are this boot's."""
    server: int | None = None
    """Its latest server's number."""
    server_running: bool = False


@dataclass(frozen=True)
class BootPlanned:
    """Planning is done: the GPUs, the learning key, the learned bytes, and what already runs."""

    uuids: tuple[str, ...]
    boot_key: str
    learned: LearnedKv | None
    vllm_version: str | None
    planned_utilization: float | None = None
    band_top: float | None = None
    existing: ExistingWorkload | None = None
    adoptable: bool = True
    """False when adoption is not possible (a group left by an earlier daemon has no monitor)."""
    # swap groups
    sleeping: bool | None = None
    """The found server's answer to /is_sleeping (None: not asked, no answer, or no server)."""
    remembered_asleep: SleepLevel | None = None
    """The level the state file says this member slept at when the earlier daemon ended (killed with -9)."""
    remembered_moving: SwapMove | None = None
    """The state file says it was falling asleep or waking at `remembered_asleep` then (killed mid-swap)."""
    snapshot: SnapshotPlan | None = None
    """The deployment's snapshot for this plan (issue 41; None: not asked)."""


@dataclass(frozen=True)
class GpusAcquired:
    """The boot slot of every assigned GPU is held."""


@dataclass(frozen=True)
class FreeMemoryRead:
    """Free bytes per assigned GPU in learning order; None where the reading failed (unknown)."""

    free: tuple[int | None, ...]


@dataclass(frozen=True)
class PortBusy:
    """Another process already listens on the deployment's port (`holder` names it)."""

    port: int
    holder: str


@dataclass(frozen=True)
class PortFree:
    """Nothing listens on the deployment's port any more (the answer to CheckPort)."""


@dataclass(frozen=True)
class WorkloadStarted:
    workload_id: str
    boot: int
    server: int | None = None
    """The launcher's server number (None: the workload is the server)."""


@dataclass(frozen=True)
class BootLog:
    """The boot log said something: the facts so far and, if any, the phase it reported."""

    facts: BootFacts
    phase: Phase | None = None


@dataclass(frozen=True)
class LogEnded:
    """The log stream ended: the workload exited, or the runtime went away (WaitExit tells which)."""


@dataclass(frozen=True)
class Exited:
    """The workload exited."""

    exit_code: int | None
    oom_killed: bool = False
    """The kernel's OOM killer ended it (the runtime knows so; never guessed from a signal)."""
    launcher_gone: bool = False
    """A launcher boot: the launcher itself (its container or process) ended, not only its server."""


@dataclass(frozen=True)
class StillRunning:
    """WaitExit timed out: the workload runs (the log stream broke off)."""


@dataclass(frozen=True)
class HealthChecked:
    status: int | None
    error: str | None = None
    sleeping: bool = False
    """/is_sleeping said the server sleeps (asked of a swap group member with sleep mode only)."""


@dataclass(frozen=True)
class WarmedUp:
    """The warm-up requests came back (`error` None), or what went wrong with them; `unwarmed`: the API
    answered a 4xx, which fails nothing but warmed nothing (said before READY)."""

    error: str | None
    seconds: float
    unwarmed: str | None = None


@dataclass(frozen=True)
class LivenessFailed:
    """A liveness probe found the ready server unusable (issue 17 feeds `FailureCause` engine_hung here)."""

    cause: FailureCause
    message: str


@dataclass(frozen=True)
class MemberLost:
    """A member of a multi-host group is gone (its reason reaches `last_failure`)."""

    reason: str


@dataclass(frozen=True)
class GpuTenants:
    """Whether NVML lists other processes on the GPUs (None: unknown), a uniform draw in [0, 1) for jitter,
    and the GPUs' free bytes now, ours stopped (one per GPU in the boot's order, None where unknown; empty:
    not read)."""

    other_processes: bool | None
    draw: float = 0.5
    free: tuple[int | None, ...] = ()


@dataclass(frozen=True)
class RuntimeUnreachable:
    """The runtime (Podman) or a group member did not answer a command: no failure of the deployment."""

    message: str
    clock_text: str = ""
    """The wall-clock time as HH:MM:SS (for the message status shows)."""
    own_resources: bool = False
    """The daemon itself was out of descriptors or memory (not the runtime's fault either)."""


@dataclass(frozen=True)
class Refused:
    """Planning or the runtime refused the configuration (a user error): restarting cannot help."""

    message: str


@dataclass(frozen=True)
class LauncherLost:
    """The launcher to reuse did not answer a start (it died, or its socket is gone): replace it."""

    message: str


@dataclass(frozen=True)
class Crashed:
    """A command failed unexpectedly (a bug, or an error of no known kind)."""

    message: str


# Swap groups (issue 16): the supervisor's swap coordinator feeds SleepRequested and
# WakeRequested; SleepServer and WakeServer are answered by the others.


@dataclass(frozen=True)
class SleepRequested:
    """Put the ready server to sleep at `level` (chosen by `swap.sleep_level`), for `reason`."""

    level: SleepLevel
    reason: str = ""


@dataclass(frozen=True)
class FellAsleep:
    """/sleep answered: the server is asleep after `seconds`."""

    seconds: float


@dataclass(frozen=True)
class SuspendFailed:
    """A suspend's level-1 sleep answered but its GPU checkpoint did not (issue 41 item 7): undone, the server
    sleeps at plain level 1 (unlocked) after `seconds`; `lasting`: the failure will come again (no checkpoint
    API here, or the driver cannot checkpoint this server), so suspend is marked unsafe for it."""

    seconds: float
    reason: str
    lasting: bool = False


@dataclass(frozen=True)
class SleepUnsupported:
    """The server has no sleep mode (`/is_sleeping` 404): it is stopped instead, and booted on wake."""

    reason: str


@dataclass(frozen=True)
class SleepFailed:
    """/sleep failed (an error, a timeout): a failure of the server, as the failure policy says."""

    message: str


@dataclass(frozen=True)
class SleepKeptMemory:
    """/sleep answered, yet NVML shows the server's processes still holding their memory (issue 29):
    the level is marked unsafe and the server stopped instead."""

    held_bytes: int
    message: str


@dataclass(frozen=True)
class WakeRequested:
    """A request (or `dankserve wake`) needs the sleeping server: wake it."""


@dataclass(frozen=True)
class WokeUp:
    """/wake_up (and for level 2 reload_weights) answered: serving again after `seconds`."""

    seconds: float


@dataclass(frozen=True)
class WokeWrong:
    """The wake answered, but the canary completion's greedy token ids differ from the fingerprint taken
    before the first sleep (issue 29): the level is marked unsafe, the server stopped and booted again."""

    message: str


@dataclass(frozen=True)
class WakeFailed:
    """The wake failed: a failure of the server, as the failure policy says."""

    message: str


# Snapshots (issue 41): CaptureSnapshot and RestoreSnapshot are answered by these.


@dataclass(frozen=True)
class SnapshotCaptured:
    """The ready server was captured and is serving again; requests waited `outage_seconds`."""

    outage_seconds: float
    bytes: int
    workload_id: str | None = None
    """The server from now on: the tree the capture restored from the image (None: the same workload)."""


@dataclass(frozen=True)
class SnapshotCaptureFailed:
    """The capture failed; `reason` says where and why. Undone before the dump ended the tree (the server
    serves); after it, the restore from the image failed and no server is left (`server_lost`: booted)."""

    reason: str
    server_lost: bool = False
    workload_id: str | None = None
    """The server serving now when it is not the captured one (restored, then the snapshot not kept)."""
    retry_in: float | None = None
    """A passing cause (clients' connections open at the dump: snapshot/tcp.py): the capture may be tried
    again this many seconds later (machine/snapshots.py bounds the tries)."""
    too_big: bool = False
    """The image would not fit (the `room` step: snapshot/room.py): the next boot's capture would pay the same
    outage (the GPU checkpoint of the whole memory) for the same refusal, so this daemon does not try again."""


@dataclass(frozen=True)
class Restored:
    """The snapshot was restored: the server serves the captured greedy ids, `seconds` after the restore began."""

    workload_id: str
    boot: int
    seconds: float
    resumed: bool = False
    """A restore a daemon killed midway left running, taken over by this one and judged by the canary."""


@dataclass(frozen=True)
class RestoreFailed:
    """The restore failed (what CRIU restored is killed, the snapshot discarded): the normal boot runs."""

    reason: str


Event = (
    Begin
    | StopRequested
    | Reconfigured
    | Tick
    | WeightsProgress
    | WeightsReady
    | WeightsFailed
    | ImageReady
    | BootPlanned
    | GpusAcquired
    | FreeMemoryRead
    | PortBusy
    | PortFree
    | WorkloadStarted
    | BootLog
    | LogEnded
    | Exited
    | StillRunning
    | HealthChecked
    | WarmedUp
    | LivenessFailed
    | MemberLost
    | GpuTenants
    | RuntimeUnreachable
    | Refused
    | Crashed
    | LauncherLost
    | SleepRequested
    | FellAsleep
    | SuspendFailed
    | SleepUnsupported
    | SleepFailed
    | SleepKeptMemory
    | WakeRequested
    | WokeUp
    | WokeWrong
    | WakeFailed
    | SnapshotCaptured
    | SnapshotCaptureFailed
    | Restored
    | RestoreFailed
)
EVENT_TYPES: tuple[type[Event], ...] = get_args(Event)
