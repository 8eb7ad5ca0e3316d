"""The commands the machine asks the interpreter to run, in order."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from dankserve.bootlog.facts import BootFacts
from dankserve.supervisor.machine.stages import (
    SleepLevel,
)
from dankserve.supervisor.machine.state import (
    BootOverrides,
)


@dataclass(frozen=True)
class EnsureWeights:
    """Fetch the weights (answered by WeightsProgress..., WeightsReady or WeightsFailed)."""


@dataclass(frozen=True)
class EnsureImage:
    """Make the image present (answered by ImageReady)."""


@dataclass(frozen=True)
class PlanBoot:
    """Plan with these overrides, find an existing workload (answered by BootPlanned)."""

    overrides: BootOverrides
    vllm_version: str | None
    digest: str | None = None


@dataclass(frozen=True)
class StopWorkload:
    workload_id: str


@dataclass(frozen=True)
class RemoveWorkload:
    workload_id: str
    best_effort: bool = False
    """An error removing it is logged, not an event (the workload already exited)."""


@dataclass(frozen=True)
class AcquireGpus:
    """Take the GPUs' boot slot, waiting (answered by GpusAcquired, or StopRequested when stopped meanwhile)."""

    uuids: tuple[str, ...]


@dataclass(frozen=True)
class ReleaseGpus:
    """Give the boot slot back (held or not)."""


@dataclass(frozen=True)
class ReadFreeMemory:
    """Read free GPU memory (answered by FreeMemoryRead); `settle_first`: wait for dead processes' memory."""

    uuids: tuple[str, ...]
    settle_first: bool


@dataclass(frozen=True)
class StartWorkload:
    """Check the port, plan with the overrides, count the boot, start (answered by WorkloadStarted or PortBusy)."""

    overrides: BootOverrides
    vllm_version: str | None
    launcher_id: str | None = None
    """Ask this running launcher for the server instead of starting a workload (answered by
    WorkloadStarted, LauncherLost or PortBusy)."""


@dataclass(frozen=True)
class CheckPort:
    """Look whether another process still holds the deployment's port (answered by PortBusy or PortFree)."""


@dataclass(frozen=True)
class StopServer:
    """Stop the launcher's server `server` (SIGTERM, then SIGKILL), keeping the launcher."""

    workload_id: str
    server: int


@dataclass(frozen=True)
class RemoveLauncher:
    """Stop and remove the deployment's launcher workload if one runs (its server stopped or exited
    already, or it waits for the next boot): a stop that does not keep it leaves nothing running."""


@dataclass(frozen=True)
class FollowLogs:
    """Follow the workload's log into BootLog events and LogEnded; `resume`: skip the lines already read."""

    workload_id: str
    resume: bool = False
    server: int | None = None
    """A launcher's server: only its lines, ending where it exited."""


@dataclass(frozen=True)
class WaitExit:
    """Wait up to `timeout` for the workload to exit (answered by Exited or StillRunning)."""

    workload_id: str
    timeout: float
    server: int | None = None
    """A launcher's server: wait for that server, not the launcher."""


@dataclass(frozen=True)
class ProbeHealth:
    """GET /health (answered by HealthChecked)."""

    timeout: float


@dataclass(frozen=True)
class WarmUp:
    """Send the served request shapes once over loopback before READY (answered by WarmedUp): the first
    user request must not pay vLLM's first-request kernel compile."""

    timeout: float


@dataclass(frozen=True)
class CountGpuTenants:
    """Ask NVML for other processes on the GPUs (answered by GpuTenants)."""

    uuids: tuple[str, ...]


@dataclass(frozen=True)
class RecordFailure:
    cause: str
    message: str | None


@dataclass(frozen=True)
class RecordRestart:
    pass


@dataclass(frozen=True)
class RecordBoot:
    """Remember the ready boot in the state file (and its learned KV bytes, if it profiled)."""

    facts: BootFacts
    kv_bytes: int | None
    learned_used: bool
    boot_key: str | None
    baseline: tuple[int, ...] | None
    """Learn from this boot against this baseline (None: do not learn)."""
    restored: bool = False
    """A snapshot's restore (boot kind `restore`, issue 41)."""


@dataclass(frozen=True)
class ForgetLearned:
    boot_key: str


@dataclass(frozen=True)
class SetRemediation:
    overrides: Mapping[str, int | float | str]
    remediated: tuple[str, ...]


@dataclass(frozen=True)
class Note:
    """A log event: `level` (info, warning, error) and its fields."""

    event: str
    level: Literal["info", "warning", "error"] = "info"
    fields: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True)
class SleepServer:
    """Swap groups: sleep at `level`; "stop" stops and removes the server (answered by FellAsleep,
    SleepUnsupported or SleepFailed): a launcher's server is stopped, its launcher kept for the wake."""

    workload_id: str
    level: SleepLevel
    server: int | None = None
    """A launcher's server (None: the workload is the server itself)."""


@dataclass(frozen=True)
class WakeServer:
    """Swap groups: wake the server slept at `level` (answered by WokeUp or WakeFailed)."""

    workload_id: str
    level: SleepLevel


@dataclass(frozen=True)
class MarkSleepUnsafe:
    """Swap groups: remember that `level` failed its check for this vLLM version and model (state.json);
    later sleeps of the member take the next safe way (1, then 2, then stop)."""

    level: SleepLevel
    reason: str
    check: Literal["sleep", "wake"] = "sleep"
    """Which check failed, for the metric: `sleep` (NVML) or `wake` (the canary, or the wake itself)."""


@dataclass(frozen=True)
class CaptureSnapshot:
    """Snapshots (issue 41): capture the ready server (answered by SnapshotCaptured or SnapshotCaptureFailed)."""

    workload_id: str


@dataclass(frozen=True)
class RestoreSnapshot:
    """Snapshots: restore the deployment's snapshot instead of starting a workload (answered by Restored or
    RestoreFailed)."""


Command = (
    EnsureWeights
    | EnsureImage
    | PlanBoot
    | StopWorkload
    | RemoveWorkload
    | AcquireGpus
    | ReleaseGpus
    | ReadFreeMemory
    | StartWorkload
    | CheckPort
    | StopServer
    | RemoveLauncher
    | FollowLogs
    | WaitExit
    | ProbeHealth
    | WarmUp
    | CountGpuTenants
    | RecordFailure
    | RecordRestart
    | RecordBoot
    | ForgetLearned
    | SetRemediation
    | Note
    | SleepServer
    | WakeServer
    | MarkSleepUnsafe
    | CaptureSnapshot
    | RestoreSnapshot
)


def note(event: str, level: Literal["info", "warning", "error"] = "info", **fields: object) -> Note:
    return Note(event, level, tuple(fields.items()))
