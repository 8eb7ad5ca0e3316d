"""A deployment's lifecycle as one pure state machine: `step(state, event, now) -> (state, commands)`.

The worker thread (`supervisor.daemon.DeploymentWorker`) is only an interpreter: it runs the
commands through the runtime, the state store and NVML, and turns what happens (a command's
result, a log line, a health answer, a timer, a stop or reload request) into events. Every
decision lives here and in the pure pieces it calls: `policy.decide` and `policy.next_restart`
(failures and restarts), `learning.decide_kv_reuse` (the learned-bytes guard) and
`lifecycle.advance_boot_phase` (boot phases only move forward). `now` is the interpreter's
monotonic clock in seconds; nothing here reads a clock, a file or a socket.

`TRANSITIONS` declares, for every stage and event type, whether the event is allowed (and the
stages it may lead to), refused (it cannot happen there: the state stays, a warning is logged)
or ignored (it may happen there and changes nothing, e.g. a late timer). The tests check `step`
against it for every pair; docs/ARCHITECTURE.md's state table is rendered from it:
``python -m dankserve.supervisor.machine --write docs/ARCHITECTURE.md``.

How producers outside this module feed events: a weights download (issue 14) answers
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
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Literal, get_args

from dankserve.bootlog.facts import BootFacts, FailureClass
from dankserve.supervisor import learning, policy
from dankserve.supervisor.lifecycle import Phase, advance_boot_phase
from dankserve.supervisor.policy import FailureCause, FailureContext, RestartSettings

HEALTH_RETRY_SECONDS = 0.05
"""How often /health is asked once this boot's log says the server is up, until it answers."""
MAX_IDLE_SECONDS = 1.0
"""The interpreter looks around (a Tick) at least this often while a workload runs."""
FREE_MEMORY_RETRY_SECONDS = 0.5
"""How often free GPU memory is read again while waiting for a dead server's memory to come back."""
PORT_RECHECK_SECONDS = 1.0
"""How often a port another process holds is looked at again: the boot starts within this of its release."""
"""How often free GPU memory is read again while waiting for a dead server's memory to come back."""
EXIT_WAIT_SECONDS = 10.0
"""How long to wait for a workload to exit after its log ended or named a failure."""
UNANSWERED_HEALTH_SECONDS = 30.0
"""This boot's log said the server is up, but /health has not answered for this long: say so (once).
Seen on a real host: a dead container's port forward left in front of its replacement's."""
UNANSWERED_HEALTH_MESSAGE = (
    "the server's log says it is up, but /health on its port has not answered for {seconds:.0f} s: "
    "something between dankserve and the server drops the connection (a stale port forward of an earlier "
    "container: check `iptables -t nat -S CNI-HOSTPORT-DNAT` and that iptables is on the default PATH, "
    "`dankserve doctor`; or a firewall); waiting until the boot timeout"
)


# --- states -----------------------------------------------------------------------------------------


class Stage(StrEnum):
    """Where a deployment's supervision is. `phase` and `status` (what `dankserve status` shows) derive from it."""

    IDLE = "idle"
    """Created, not yet started."""
    DOWNLOADING = "downloading"
    """The model's weights are fetched (a percentage is shown)."""
    PULLING = "pulling"
    """The image (or the process runtime's executable) is made present."""
    PLANNING = "planning"
    """Planning the boot and looking for a workload to adopt."""
    WAITING_GPUS = "waiting_gpus"
    """Waiting for the assigned GPUs' boot slot (boots sharing a GPU are serialised)."""
    MEASURING = "measuring"
    """Reading free GPU memory for the learned-bytes guard (and waiting for a dead server's to return)."""
    STARTING = "starting"
    """The runtime starts the workload."""
    BOOTING = "booting"
    """The workload runs; its log moves the boot phase; readiness needs the log's startup line and /health."""
    READY = "ready"
    """Serving; /health is polled."""
    ENDING = "ending"
    """The log named a failure: waiting for the workload to exit."""
    DECIDING = "deciding"
    """A boot failed and its workload is gone: asking NVML who else holds the GPUs, then the policy."""
    BACKOFF = "backoff"
    """Waiting to restart after a failure."""
    RETRY_WAIT = "retry_wait"
    """The runtime was unreachable (or the port held by another process): waiting to try again, no failure counted."""
    FAILED = "failed"
    """Given up: a configuration error or too many failures; not restarted until `up` or a config change."""
    STOPPED = "stopped"
    """Stopped on request."""
    # Swap groups (issue 16): these three only follow READY.
    FALLING_ASLEEP = "falling_asleep"
    """vLLM's /sleep is asked (a swap group member makes room for another)."""
    ASLEEP = "asleep"
    """Asleep: level 1 or 2 (the server runs, its GPU memory freed) or stopped (no sleep mode: boots on wake)."""
    WAKING = "waking"
    """vLLM's /wake_up is asked (level 2: the staged wake with reload_weights)."""


TERMINAL = frozenset({Stage.FAILED, Stage.STOPPED})
RUNNING = frozenset({Stage.BOOTING, Stage.READY, Stage.ENDING})
"""Stages in which a workload of this deployment runs and is followed."""
PREPARING = frozenset(
    {Stage.DOWNLOADING, Stage.PULLING, Stage.PLANNING, Stage.WAITING_GPUS, Stage.MEASURING, Stage.STARTING}
)
SLEEP_STAGES = frozenset({Stage.FALLING_ASLEEP, Stage.ASLEEP, Stage.WAKING})
"""Swap groups' stages: a workload runs in them unless the member sleeps by being stopped (`swap.level` stop)."""
BOOT_PHASES = (Phase.STARTING, Phase.LOADING, Phase.COMPILING, Phase.PROFILING, Phase.CAPTURING)

_STAGE_PHASE: dict[Stage, Phase] = {
    Stage.IDLE: Phase.STOPPED,
    Stage.DOWNLOADING: Phase.DOWNLOADING,
    Stage.PULLING: Phase.PULLING,
    Stage.PLANNING: Phase.PLANNING,
    Stage.WAITING_GPUS: Phase.PLANNING,
    Stage.MEASURING: Phase.PLANNING,
    Stage.STARTING: Phase.STARTING,
    Stage.READY: Phase.READY,
    Stage.DECIDING: Phase.RESTARTING,
    Stage.BACKOFF: Phase.RESTARTING,
    Stage.RETRY_WAIT: Phase.RESTARTING,
    Stage.FAILED: Phase.FAILED,
    Stage.STOPPED: Phase.STOPPED,
    Stage.FALLING_ASLEEP: Phase.FALLING_ASLEEP,
    Stage.ASLEEP: Phase.ASLEEP,
    Stage.WAKING: Phase.WAKING,
}
StatusState = Literal["starting", "ready", "restarting", "failed", "stopped", "falling_asleep", "asleep", "waking"]
_STAGE_STATUS: dict[Stage, StatusState] = {
    Stage.IDLE: "stopped",
    Stage.READY: "ready",
    Stage.DECIDING: "restarting",
    Stage.BACKOFF: "restarting",
    Stage.RETRY_WAIT: "restarting",
    Stage.FAILED: "failed",
    Stage.STOPPED: "stopped",
    Stage.FALLING_ASLEEP: "falling_asleep",
    Stage.ASLEEP: "asleep",
    Stage.WAKING: "waking",
}


@dataclass(frozen=True)
class MachineConfig:
    """What the machine needs of the settings (a reload hands it a new one)."""

    restart: RestartSettings
    boot_timeout_seconds: float = 1800.0
    health_interval_seconds: float = 5.0
    gpu_memory_settle_seconds: float = 10.0
    max_model_len_setting: int | Literal["auto"] | None = None
    gpu_memory_utilization_setting: float | None = None
    download_weights: bool = False
    """dankserve fetches the weights itself before the first boot (issue 14): start in `downloading`."""


@dataclass(frozen=True)
class BootOverrides:
    """What the supervisor changes in a deployment's plan for the next boot."""

    kv_cache_memory_bytes: int | None = None
    """A learned value to pass as --kv-cache-memory-bytes (None: let vLLM profile)."""
    max_model_len: int | str | None = None
    """A remediation of a max-length error (vLLM's estimate, or 'auto')."""
    gpu_memory_utilization: float | None = None
    """A remediation of a no-KV-memory error (the top of the table band)."""

    @classmethod
    def from_remediation(cls, values: Mapping[str, int | float | str]) -> BootOverrides:
        """The overrides a policy remediation (or the state file's record of one) names; unknown keys ignored."""
        return cls().with_remediation(values)

    def with_remediation(self, values: Mapping[str, int | float | str]) -> BootOverrides:
        out = self
        if "max_model_len" in values:
            length = values["max_model_len"]
            out = replace(out, max_model_len=length if isinstance(length, str) else int(length))
        if "gpu_memory_utilization" in values:
            out = replace(out, gpu_memory_utilization=float(values["gpu_memory_utilization"]))
        return out


@dataclass(frozen=True)
class Outage:
    """The runtime unreachable while a workload runs: since when, and when to ask it again."""

    since: float
    attempts: int
    next_try: float


@dataclass(frozen=True)
class Boot:
    """One boot: from planning until its workload is gone."""

    started_at: float
    uuids: tuple[str, ...] = ()
    boot_key: str | None = None
    learned: learning.LearnedKv | None = None
    planned_utilization: float | None = None
    band_top: float | None = None
    workload_id: str | None = None
    adopted: bool = False
    settle_until: float = 0.0
    baseline: tuple[int, ...] | None = None
    """Free bytes per GPU before the boot (None: unknown, so nothing is learned from it)."""
    learned_used: int | None = None
    deadline: float = 0.0
    next_health: float = 0.0
    unhealthy: int = 0
    log_ended: bool = False
    outage: Outage | None = None
    facts: BootFacts = field(default_factory=BootFacts)
    phase: Phase = Phase.STARTING
    ready_at: float | None = None
    up_logged_at: float | None = None
    """When this boot's log first said the server is up (the startup line)."""
    unanswered_warned: bool = False
    # launcher
    launcher_id: str | None = None
    """A running launcher (kept from an earlier boot) that starts this boot's server."""
    server: int | None = None
    """This boot's server number in its launcher (None: the workload is the server itself)."""


@dataclass(frozen=True)
class Failure:
    """A failure waiting for the policy's decision."""

    cause: FailureCause
    message: str | None
    facts: BootFacts | None
    served: bool
    """The boot had become ready (a server that died while serving)."""
    asleep: bool = False
    """A swap group member's server died while asleep: no request waits for it, so rather than
    boot again now (taking the GPU from the awake members) it stays asleep, by stop, until woken."""


@dataclass(frozen=True)
class LastFailure:
    cause: str
    message: str | None
    at: float
    """Monotonic time, like `now`."""


SleepLevel = Literal["1", "2", "stop"]
"""vLLM's sleep level 1 (weights to CPU RAM), 2 (weights dropped), or stop and boot (no sleep mode)."""
SLEEP_LEVELS: Mapping[str, SleepLevel] = {level: level for level in get_args(SleepLevel)}
"""Each sleep level by its name (as the state file keeps it)."""
SwapMove = Literal["falling_asleep", "waking"]
"""A sleep or a wake under way (the stages' names)."""
SWAP_MOVES: Mapping[str, SwapMove] = {move: move for move in get_args(SwapMove)}
"""Each move by its name (as the state file keeps it)."""


@dataclass(frozen=True)
class SleepRecord:
    """What the state file keeps of a swap group member's sleep: written before status shows it and before
    /sleep or /wake_up is sent, so that a daemon following one killed with -9 (even mid-sleep or mid-wake)
    takes the member over as it was."""

    level: SleepLevel
    moving: SwapMove | None = None
    """The sleep or wake under way at that level (None: asleep)."""


@dataclass(frozen=True)
class SwapTimes:
    """A swap group member's sleeping and waking: the current one and the last ones' timings."""

    level: SleepLevel | None = None
    """The level it sleeps at (or fell asleep at last)."""
    since: float | None = None
    """When the current sleep or wake began (monotonic)."""
    wake_wanted: bool = False
    """A wake was asked for while falling asleep: wake as soon as asleep."""
    last_sleep_seconds: float | None = None
    last_wake_seconds: float | None = None
    last_level: SleepLevel | None = None
    last_at: float | None = None
    """When the last sleep or wake ended (monotonic)."""
    last_kind: Literal["sleep", "wake"] | None = None
    """Which of the two ended last."""


@dataclass(frozen=True)
class MachineState:
    """Everything the machine knows of one deployment. Frozen: `step` returns a new one."""

    config: MachineConfig
    stage: Stage = Stage.IDLE
    overrides: BootOverrides = BootOverrides()
    remediated: frozenset[FailureCause] = frozenset()
    relearned: bool = False
    failures: tuple[float, ...] = ()
    retry_attempts: int = 0
    """Tries since the runtime was last reachable (RETRY_WAIT's backoff)."""
    boots: int = 0
    restarts: int = 0
    boot: Boot | None = None
    pending: Failure | None = None
    last_failure: LastFailure | None = None
    message: str | None = None
    wake_at: float | None = None
    """When the interpreter feeds a Tick (None: not before something else happens)."""
    # What status keeps showing between boots.
    vllm_version: str | None = None
    gpu_uuids: tuple[str, ...] = ()
    kv_cache_memory_bytes: int | None = None
    kv_cache_learned_used: bool = False
    compile_cache_hit: bool | None = None
    compile_seconds: float | None = None
    swap: SwapTimes = SwapTimes()
    """Swap groups (issue 16): sleep level and timings."""
    port_holder: str | None = None
    """Who holds the deployment's port while RETRY_WAIT waits for it (CheckPort every PORT_RECHECK_SECONDS)."""

    @property
    def phase(self) -> Phase:
        """The lifecycle phase `status` and systemd's STATUS= show."""
        if self.stage in (Stage.BOOTING, Stage.ENDING):
            return self.boot.phase if self.boot is not None else Phase.STARTING
        return _STAGE_PHASE[self.stage]

    @property
    def status(self) -> StatusState:
        """The `state` field of `dankserve status`."""
        if self.swap.since is not None and (self.stage in PREPARING or self.stage is Stage.BOOTING):
            return "waking"  # a swap group member that sleeps by stopping boots to wake
        return _STAGE_STATUS.get(self.stage, "starting")

    @property
    def sleep_record(self) -> SleepRecord | None:
        """A swap group member's sleep while asleep, falling asleep or waking (from its level), else None."""
        level = self.swap.level
        if level is None or self.stage not in SLEEP_STAGES:
            return None
        return SleepRecord(level, None if self.stage is Stage.ASLEEP else SWAP_MOVES[self.stage.value])

    @property
    def workload_id(self) -> str | None:
        return self.boot.workload_id if self.boot is not None else None

    @property
    def facts(self) -> BootFacts | None:
        return self.boot.facts if self.boot is not None else None

    @property
    def weights_percent(self) -> int | None:
        return self.boot.facts.weights_percent if self.boot is not None else None


def initial_state(
    config: MachineConfig,
    *,
    overrides: BootOverrides = BootOverrides(),
    remediated: frozenset[FailureCause] = frozenset(),
    boots: int = 0,
    restarts: int = 0,
) -> MachineState:
    """A machine before `Begin`, carrying what the state file remembers."""
    return MachineState(config, overrides=overrides, remediated=remediated, boots=boots, restarts=restarts)


# --- events -----------------------------------------------------------------------------------------


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
    learned: learning.LearnedKv | None
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
    """Whether NVML lists other processes on the GPUs (None: unknown), and a uniform draw in [0, 1) for jitter."""

    other_processes: bool | None
    draw: float = 0.5


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
class SleepUnsupported:
    """The server has no sleep mode (`/is_sleeping` 404): it is stopped instead, and booted on wake."""

    reason: str


@dataclass(frozen=True)
class SleepFailed:
    """/sleep failed (an error, a timeout): a failure of the server, as the failure policy says."""

    message: str


@dataclass(frozen=True)
class WakeRequested:
    """A request (or `dankserve wake`) needs the sleeping server: wake it."""


@dataclass(frozen=True)
class WokeUp:
    """/wake_up (and for level 2 reload_weights) answered: serving again after `seconds`."""

    seconds: float


@dataclass(frozen=True)
class WakeFailed:
    """The wake failed: a failure of the server, as the failure policy says."""

    message: str


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
    | LivenessFailed
    | MemberLost
    | GpuTenants
    | RuntimeUnreachable
    | Refused
    | Crashed
    | LauncherLost
    | SleepRequested
    | FellAsleep
    | SleepUnsupported
    | SleepFailed
    | WakeRequested
    | WokeUp
    | WakeFailed
)
EVENT_TYPES: tuple[type[Event], ...] = get_args(Event)


# --- commands ---------------------------------------------------------------------------------------


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
    | CountGpuTenants
    | RecordFailure
    | RecordRestart
    | RecordBoot
    | ForgetLearned
    | SetRemediation
    | Note
    | SleepServer
    | WakeServer
)


def note(event: str, level: Literal["info", "warning", "error"] = "info", **fields: object) -> Note:
    return Note(event, level, tuple(fields.items()))


# --- the table --------------------------------------------------------------------------------------

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
        for late in (BootLog, LogEnded, HealthChecked, WeightsProgress, LivenessFailed, MemberLost):
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
        t[stage, LogEnded] = _allowed(stage)
        t[stage, Exited] = _allowed(*_ON_FAILURE)
        t[stage, StillRunning] = _allowed(stage)
        t[stage, HealthChecked] = (
            _allowed(Stage.READY, Stage.WAKING, *_ON_FAILURE)
            if stage == Stage.READY
            else _allowed(Stage.BOOTING, Stage.READY)
        )
        t[stage, Tick] = _allowed(stage, *_ON_FAILURE)
        t[stage, RuntimeUnreachable] = _allowed(stage, note="follows on; the server is still probed")
        t[stage, MemberLost] = _allowed(*_ON_FAILURE)
    t[Stage.READY, LivenessFailed] = _allowed(*_ON_FAILURE)
    t[Stage.ENDING, Exited] = _allowed(*_ON_FAILURE)
    t[Stage.ENDING, StillRunning] = _allowed(*_ON_FAILURE)
    t[Stage.DECIDING, GpuTenants] = _allowed(Stage.BACKOFF, Stage.FAILED, Stage.ASLEEP, note="its server died asleep")
    t[Stage.BACKOFF, Tick] = _allowed(Stage.BACKOFF, *_RESTART)
    t[Stage.RETRY_WAIT, Tick] = _allowed(Stage.RETRY_WAIT, *_RESTART)
    t[Stage.RETRY_WAIT, PortBusy] = _allowed(Stage.RETRY_WAIT, note="looks at the port again")
    t[Stage.RETRY_WAIT, PortFree] = _allowed(*_RESTART)
    _swap_transitions(t)
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
    t[Stage.FALLING_ASLEEP, SleepUnsupported] = _allowed(Stage.FALLING_ASLEEP, note="stopped instead")
    t[Stage.FALLING_ASLEEP, SleepFailed] = _allowed(*_ON_FAILURE)
    t[Stage.ASLEEP, WakeRequested] = _allowed(Stage.WAKING, *_RESTART, note="stop: boots")
    t[Stage.ASLEEP, Reconfigured] = _allowed(*_RECONFIGURE, Stage.ASLEEP, note="a swap member stays asleep, by stop")
    t[Stage.WAKING, WokeUp] = _allowed(Stage.READY)
    t[Stage.WAKING, WakeFailed] = _allowed(*_ON_FAILURE)
    for stage in SLEEP_STAGES:
        # The server still runs (unless stopped to sleep): it may die meanwhile.
        t[stage, LogEnded] = _allowed(stage)
        t[stage, Exited] = _allowed(*_ON_FAILURE, stage, note="stop: nothing ran")
        t[stage, StillRunning] = _allowed(stage)


TRANSITIONS: Mapping[tuple[Stage, type[Event]], Transition] = _transitions()


# --- step -------------------------------------------------------------------------------------------

Step = tuple[MachineState, tuple[Command, ...]]


def step(state: MachineState, event: Event, now: float) -> Step:
    """The state after `event` at `now`, and the commands the interpreter must run (in order)."""
    rule = TRANSITIONS[state.stage, type(event)]
    if rule.kind == "ignored":
        return state, ()
    if rule.kind == "refused":
        return state, (note("event_refused", "warning", stage=state.stage.value, received=type(event).__name__),)
    return _HANDLERS[type(event)](state, event, now)


def _begin_boot(state: MachineState, now: float) -> Step:
    boot = Boot(started_at=now)
    base = replace(state, boot=boot, pending=None, message=None, wake_at=None, port_holder=None)
    if state.config.download_weights:
        return replace(base, stage=Stage.DOWNLOADING), (EnsureWeights(),)
    return replace(base, stage=Stage.PULLING), (EnsureImage(),)


def _teardown(state: MachineState, *, keep_launcher: bool = True) -> tuple[Command, ...]:
    """Stop and remove the running workload (if any) and give the GPUs back.

    A launcher's server is stopped and its launcher kept for the next boot (unless `keep_launcher`
    is False: SIGTERM, or the deployment removed)."""
    wid = state.workload_id
    out: list[Command] = []
    if wid is not None and (state.stage in RUNNING or state.stage in SLEEP_STAGES):
        server = state.boot.server if state.boot is not None else None
        if server is not None and keep_launcher:
            out.append(StopServer(wid, server))
        else:
            out += [StopWorkload(wid), RemoveWorkload(wid)]
    out.append(ReleaseGpus())
    return tuple(out)


def _exited_teardown(state: MachineState, launcher_gone: bool) -> tuple[Command, ...]:
    """After the server exited: remove its workload, unless it was a launcher's server and the launcher lives."""
    boot = state.boot
    wid = state.workload_id or ""
    if boot is not None and boot.server is not None and not launcher_gone:
        return ()
    return (RemoveWorkload(wid, best_effort=True),)


def _on_begin(state: MachineState, event: Begin, now: float) -> Step:
    if event.asleep:
        # Its first boot would put the group's awake members to sleep: the first request boots it.
        swap = replace(state.swap, level="stop", since=None, wake_wanted=False)
        after = replace(state, stage=Stage.ASLEEP, boot=None, swap=swap, wake_at=None)
        return after, (
            note("joined_asleep", reason="added by a reload to a running swap group: its first request boots it"),
        )
    return _begin_boot(state, now)


def _on_stop(state: MachineState, event: StopRequested, now: float) -> Step:
    commands = _teardown(state, keep_launcher=event.keep_launcher)
    if not event.keep_launcher and not any(isinstance(c, RemoveWorkload) for c in commands):
        # No running server to remove with it (asleep by stop, backing off, planning...): a launcher
        # kept for the next boot may still run.
        commands = (RemoveLauncher(), *commands)
    return replace(state, stage=Stage.STOPPED, boot=None, pending=None, wake_at=None, message=None), commands


def _on_reconfigured(state: MachineState, event: Reconfigured, now: float) -> Step:
    commands = (*_teardown(state), SetRemediation({}, ()))
    fresh = replace(
        state,
        config=event.config,
        overrides=BootOverrides(),
        remediated=frozenset(),
        relearned=False,
        failures=(),
        retry_attempts=0,
    )
    if state.stage is Stage.ASLEEP and event.swap_member:
        # Booting now would put the awake members to sleep: the server planned with the old
        # configuration stops (a launcher stays), and the next request boots with the new one.
        swap = replace(state.swap, level="stop", since=None, wake_wanted=False)
        kept = note(
            "reload_kept_asleep",
            sleep_level_was=state.swap.level,
            reason="its configuration changed while asleep: its server is stopped, and its next request boots it "
            "with the new configuration (booting now would put the awake members to sleep)",
        )
        return replace(fresh, boot=None, swap=swap, wake_at=None), (kept, *commands)
    after, begin = _begin_boot(fresh, now)
    return after, (*commands, *begin)


def _on_tick(state: MachineState, event: Tick, now: float) -> Step:
    if state.stage in (Stage.BACKOFF, Stage.RETRY_WAIT):
        if state.wake_at is not None and now < state.wake_at:
            return state, ()
        if state.stage is Stage.RETRY_WAIT and state.port_holder is not None:
            return replace(state, wake_at=now + PORT_RECHECK_SECONDS), (CheckPort(),)
        return _begin_boot(state, now)
    if state.stage is Stage.MEASURING:
        boot = state.boot
        if boot is None or state.wake_at is None or now < state.wake_at:
            return state, ()
        return replace(state, wake_at=None), (ReadFreeMemory(boot.uuids, settle_first=False),)
    return _watch(state, now)


def _on_weights_progress(state: MachineState, event: WeightsProgress, now: float) -> Step:
    boot = state.boot or Boot(started_at=now)
    facts = replace(boot.facts, weights_percent=max(0, min(100, event.percent)))
    return replace(state, boot=replace(boot, facts=facts)), ()


def _on_weights_ready(state: MachineState, event: WeightsReady, now: float) -> Step:
    return replace(state, stage=Stage.PULLING), (EnsureImage(),)


def _on_weights_failed(state: MachineState, event: WeightsFailed, now: float) -> Step:
    if event.permanent:  # no such model or revision, or gated without a token: a configuration error
        cause = FailureCause.MODEL_NOT_FOUND
        after, commands = _fail(state, event.message, cause.value)
        after = replace(after, last_failure=LastFailure(cause.value, event.message, now))
        return after, (RecordFailure(cause.value, event.message), *commands)
    return _retry_later(state, event.message, now)


def _on_image_ready(state: MachineState, event: ImageReady, now: float) -> Step:
    version = event.vllm_version or state.vllm_version
    return replace(state, stage=Stage.PLANNING, vllm_version=version), (
        PlanBoot(state.overrides, event.vllm_version, event.digest),
    )


def _on_boot_planned(state: MachineState, event: BootPlanned, now: float) -> Step:
    boot = replace(
        state.boot or Boot(started_at=now),
        uuids=event.uuids,
        boot_key=event.boot_key,
        learned=event.learned,
        planned_utilization=event.planned_utilization,
        band_top=event.band_top,
    )
    state = replace(state, gpu_uuids=event.uuids, vllm_version=event.vllm_version or state.vllm_version)
    existing = event.existing
    launcher = existing.launcher if existing is not None else None
    server_runs = launcher is None or (launcher.server_running and launcher.server is not None)
    adopt = existing is not None and existing.running and existing.same_plan and event.adoptable and server_runs
    unfinished = unfinished_swap(event, adopt=adopt, waking=state.swap.since is not None)
    if unfinished is not None:
        return _finish_swap(state, boot, event, unfinished, now)
    asleep = found_asleep(event, adopt=adopt, waking=state.swap.since is not None)
    if asleep is not None:
        return _adopt_asleep(state, boot, event, asleep)
    if adopt and existing is not None:
        # An adopted boot keeps its GPUs' slot (claimed at start-up) until ready.
        boot = replace(
            boot,
            workload_id=existing.id,
            adopted=True,
            deadline=now + state.config.boot_timeout_seconds,
            phase=Phase.STARTING,
            server=launcher.server if launcher is not None else None,
        )
        adopted = replace(state, stage=Stage.BOOTING, boot=boot, wake_at=now + MAX_IDLE_SECONDS)
        return adopted, (
            note("adopting", container_id=existing.id, server=boot.server),
            FollowLogs(existing.id, server=boot.server),
        )
    commands: list[Command] = [ReleaseGpus()]
    if existing is not None and existing.running and launcher is not None and launcher.reusable:
        # launcher: the same container-level settings: keep it, stop its old server, ask it for a new one.
        boot = replace(boot, launcher_id=existing.id)
        commands.append(note("reusing_launcher", container_id=existing.id, server_running=launcher.server_running))
        if launcher.server_running and launcher.server is not None:
            commands.append(StopServer(existing.id, launcher.server))
    elif existing is not None:
        commands += [
            note("replacing", container_id=existing.id, running=existing.running),
            StopWorkload(existing.id),
            RemoveWorkload(existing.id),
        ]
    commands.append(AcquireGpus(event.uuids))
    return replace(state, stage=Stage.WAITING_GPUS, boot=boot), tuple(commands)


def found_asleep(event: BootPlanned, *, adopt: bool, waking: bool) -> SleepLevel | None:
    """The level a swap group member an earlier daemon (killed with -9) left asleep sleeps at, else None.

    `adopt`: its server runs and may be adopted. The state file remembers the level; the server's
    /is_sleeping has the last word on whether it sleeps (level unknown: 2, whose staged wake with
    reload_weights serves both levels). Asleep by stop there is no server: nothing, a stopped
    workload, or a launcher without one, is found. A wake by booting (`waking`) plans afresh."""
    remembered = event.remembered_asleep
    if waking:
        return None
    if adopt:
        if event.sleeping is False or (event.sleeping is None and remembered not in ("1", "2")):
            return None
        return remembered if remembered in ("1", "2") else "2"
    existing = event.existing
    launcher = existing.launcher if existing is not None else None
    kept = launcher is not None and existing is not None and existing.running and launcher.reusable
    if remembered == "stop" and (existing is None or (kept and launcher is not None and not launcher.server_running)):
        return "stop"
    return None


def unfinished_swap(event: BootPlanned, *, adopt: bool, waking: bool) -> SleepRecord | None:
    """The sleep or wake an earlier daemon (killed with -9) left under way, to be done again, else None.

    The state file records the move before /sleep or /wake_up is sent, and the server finishes
    what it was sent after the daemon is gone. Both are safe to send again: a second /sleep of
    a sleeping server and a /wake_up of awake memory do nothing, and the staged level-2 wake
    reloads the weights whichever of its steps the kill interrupted (woken without
    reload_weights they are garbage). Meanwhile the member counts as holding its GPU memory. A
    server that says it sleeps after a sleep is adopted asleep (`found_asleep`); `adopt`: its
    server runs and may be adopted; a wake by booting (`waking`) plans afresh.

    A member asleep (or falling asleep) by stop whose workload is left behind not running was killed
    during the stop, or between the stop and the removal. Podman says a container that is still
    stopping is not running while its server tears down and holds its GPU memory, so the stop is done
    again (it waits for the teardown) and the workload removed before the member counts as asleep."""
    level, moving = event.remembered_asleep, event.remembered_moving
    existing = event.existing
    if not waking and level == "stop" and existing is not None and not existing.running:
        return SleepRecord("stop", "falling_asleep")
    if not adopt or waking or level is None or moving is None:
        return None
    if moving == "falling_asleep" and event.sleeping is True and level != "stop":
        return None
    return SleepRecord(level, moving)


def _finish_swap(state: MachineState, boot: Boot, event: BootPlanned, record: SleepRecord, now: float) -> Step:
    """Adopted falling asleep or waking as the earlier daemon left it: the same sleep or wake is sent again.
    A workload that no longer runs (a stop left unfinished) is stopped and removed as a whole, its logs not followed."""
    existing = event.existing
    assert existing is not None and record.moving is not None  # unfinished_swap: a workload
    running = existing.running
    server = existing.launcher.server if existing.launcher is not None and running else None
    boot = replace(boot, workload_id=existing.id, adopted=True, phase=Phase.READY, server=server)
    swap = replace(state.swap, level=record.level, since=now, wake_wanted=False)
    command: Command = (
        SleepServer(existing.id, record.level, server=server)
        if record.moving == "falling_asleep"
        else WakeServer(existing.id, record.level)
    )
    after = replace(state, stage=Stage(record.moving), boot=boot, swap=swap, wake_at=None)
    follow: tuple[Command, ...] = (FollowLogs(existing.id, server=server),) if running else ()
    return after, (
        note(f"adopting_{record.moving}", sleep_level=record.level, container_id=existing.id, server=server),
        *follow,
        ReleaseGpus(),
        command,
    )


def _adopt_asleep(state: MachineState, boot: Boot, event: BootPlanned, level: SleepLevel) -> Step:
    """Asleep as the earlier daemon left it: the server (if any) is followed, not woken; the GPUs' slot goes back."""
    swap = replace(state.swap, level=level, since=None, wake_wanted=False)
    existing = event.existing
    if level == "stop" or existing is None:  # the wake boots (through the kept launcher, if any)
        after = replace(state, stage=Stage.ASLEEP, boot=None, swap=swap, wake_at=None)
        container = existing.id if existing is not None else None
        return after, (note("adopting_asleep", sleep_level=level, container_id=container), ReleaseGpus())
    launcher = existing.launcher
    server = launcher.server if launcher is not None else None
    boot = replace(boot, workload_id=existing.id, adopted=True, phase=Phase.READY, server=server)
    after = replace(state, stage=Stage.ASLEEP, boot=boot, swap=swap, wake_at=None)
    return after, (
        note("adopting_asleep", sleep_level=level, container_id=existing.id, server=server),
        FollowLogs(existing.id, server=server),
        ReleaseGpus(),
    )


def _on_gpus_acquired(state: MachineState, event: GpusAcquired, now: float) -> Step:
    boot = state.boot or Boot(started_at=now)
    boot = replace(boot, settle_until=now + state.config.gpu_memory_settle_seconds)
    return replace(state, stage=Stage.MEASURING, boot=boot), (ReadFreeMemory(boot.uuids, settle_first=True),)


def kv_decision(learned: learning.LearnedKv | None, free: Sequence[int | None]) -> learning.KvDecision:
    """`learning.decide_kv_reuse`, where a GPU whose free memory is unknown never passes the guard."""
    unknown = [i for i, value in enumerate(free) if value is None]
    if unknown:
        return learning.KvDecision(
            None,
            f"free memory of GPU {unknown[0]} is unknown (the reading failed): "
            + ("vLLM profiles memory" if learned is not None else "no KV size learned yet: vLLM profiles memory"),
        )
    return learning.decide_kv_reuse(learned, [value for value in free if value is not None])


def _on_free_memory(state: MachineState, event: FreeMemoryRead, now: float) -> Step:
    boot = state.boot or Boot(started_at=now)
    decision = kv_decision(boot.learned, event.free)
    if decision.use_bytes is None and boot.learned is not None and now < boot.settle_until:
        # A server that just died frees its memory a few seconds later: read again before profiling.
        return replace(state, wake_at=now + FREE_MEMORY_RETRY_SECONDS), ()
    known = None if any(value is None for value in event.free) else tuple(v for v in event.free if v is not None)
    boot = replace(boot, baseline=known, learned_used=decision.use_bytes)
    overrides = replace(state.overrides, kv_cache_memory_bytes=decision.use_bytes)
    after = replace(
        state, stage=Stage.STARTING, boot=boot, wake_at=None, kv_cache_learned_used=decision.use_bytes is not None
    )
    return after, (
        note("kv_cache_decision", use_bytes=decision.use_bytes, reason=decision.reason),
        StartWorkload(overrides, state.vllm_version, launcher_id=boot.launcher_id),
    )


def _on_port_busy(state: MachineState, event: PortBusy, now: float) -> Step:
    """The port is held: no boot, no failure; looked at again every PORT_RECHECK_SECONDS (said once per holder)."""
    recheck = now + PORT_RECHECK_SECONDS
    if state.stage is Stage.RETRY_WAIT and state.port_holder == event.holder:
        return replace(state, wake_at=recheck), ()
    why = f"port {event.port} is in use by {event.holder}"
    after = replace(
        state,
        stage=Stage.RETRY_WAIT,
        port_holder=event.holder,
        wake_at=recheck,
        pending=None,
        message=f"{why}; fix: stop that process, or give this deployment another `port` in the config; "
        "it starts as soon as the port is free",
    )
    return after, (ReleaseGpus(), note("port_in_use", "warning", error=why, port=event.port))


def _on_port_free(state: MachineState, event: PortFree, now: float) -> Step:
    after, commands = _begin_boot(state, now)
    return after, (note("port_free", port_holder=state.port_holder), *commands)


def _on_workload_started(state: MachineState, event: WorkloadStarted, now: float) -> Step:
    boot = replace(
        state.boot or Boot(started_at=now),
        workload_id=event.workload_id,
        deadline=now + state.config.boot_timeout_seconds,
        phase=Phase.STARTING,
        server=event.server,
    )
    after = replace(state, stage=Stage.BOOTING, boot=boot, boots=event.boot, wake_at=now + MAX_IDLE_SECONDS)
    return after, (
        note("started", container_id=event.workload_id, boot=event.boot, server=event.server),
        FollowLogs(event.workload_id, server=event.server),
    )


def _on_boot_log(state: MachineState, event: BootLog, now: float) -> Step:
    boot = state.boot
    if boot is None:
        return state, ()
    facts = event.facts
    commands: list[Command] = []
    phase = boot.phase
    if event.phase is not None and state.stage is Stage.BOOTING:
        moved = advance_boot_phase(phase, event.phase)
        if moved is not Phase.READY:  # ready is /health's and the log's together, decided below
            phase = moved
    boot = replace(boot, facts=facts, phase=phase)
    state = replace(
        state,
        boot=boot,
        vllm_version=facts.vllm_version or state.vllm_version,
        compile_cache_hit=facts.compile_cache_hit,
        compile_seconds=facts.compile_seconds,
    )
    if state.stage is Stage.BOOTING and facts.failure is not None and facts.failure != FailureClass.ENGINE_DEAD:
        # vLLM exits after these: give it a moment, then make sure.
        pending = Failure(FailureCause.from_log(facts.failure), facts.failure_message, facts, served=False)
        return replace(state, stage=Stage.ENDING, pending=pending, wake_at=None), (
            *commands,
            WaitExit(boot.workload_id or "", EXIT_WAIT_SECONDS, server=boot.server),
        )
    if state.stage is Stage.BOOTING and facts.ready and boot.up_logged_at is None:
        boot = replace(boot, up_logged_at=now)
        state = replace(state, boot=boot)
    if state.stage is Stage.BOOTING and facts.ready and now >= boot.next_health:
        # This boot's own log says the server is up: ask /health now.
        boot = replace(boot, next_health=now + HEALTH_RETRY_SECONDS)
        return replace(state, boot=boot, wake_at=now + HEALTH_RETRY_SECONDS), (*commands, ProbeHealth(1.0))
    return state, tuple(commands)


def _on_log_ended(state: MachineState, event: LogEnded, now: float) -> Step:
    boot = state.boot
    if boot is None:
        return state, ()
    state = replace(state, boot=replace(boot, log_ended=True))
    if state.stage in SLEEP_STAGES:  # no health probes while asleep: ask the runtime whether it exited
        return state, (WaitExit(boot.workload_id or "", EXIT_WAIT_SECONDS, server=boot.server),)
    return _watch(state, now)


def _on_exited(state: MachineState, event: Exited, now: float) -> Step:
    boot = state.boot
    if boot is None:
        return state, ()
    if state.stage is Stage.ENDING and state.pending is not None:
        return _decide_after(state, state.pending, _exited_teardown(state, event.launcher_gone))
    served = state.stage is Stage.READY or state.stage in SLEEP_STAGES
    facts = boot.facts
    if facts.failure is not None:
        cause = FailureCause.from_log(facts.failure)
    elif served:
        cause = FailureCause.ENGINE_DEAD
    elif event.exit_code == 2:
        cause = FailureCause.BAD_ARGUMENT
    else:
        cause = FailureCause.CRASH
    message = facts.failure_message or f"vLLM exited with code {event.exit_code}"
    if event.oom_killed:
        message += " (killed by the kernel's OOM killer: host RAM)"
    asleep = state.stage is Stage.ASLEEP
    failure = Failure(cause, message, facts, served, asleep=asleep)
    return _decide_after(state, failure, _exited_teardown(state, event.launcher_gone))


def _on_still_running(state: MachineState, event: StillRunning, now: float) -> Step:
    boot = state.boot
    if boot is None:
        return state, ()
    wid = boot.workload_id or ""
    if state.stage is Stage.ENDING and state.pending is not None:
        return _decide_after(state, state.pending, _teardown(state))
    commands: list[Command] = []
    message = state.message
    if boot.outage is not None:
        commands.append(note("runtime_reconnected", container_id=wid, after_seconds=round(now - boot.outage.since, 1)))
        message = None
    boot = replace(boot, outage=None, log_ended=False)
    return replace(state, boot=boot, message=message), (*commands, FollowLogs(wid, resume=True, server=boot.server))


def _on_health(state: MachineState, event: HealthChecked, now: float) -> Step:
    boot = state.boot
    if boot is None:
        return state, ()
    config = state.config
    if state.stage is Stage.BOOTING:
        # Ready needs this boot's own evidence (its log's startup line) as well as /health: another
        # server left on the port would answer /health before this one has said anything.
        if not (event.status == 200 and boot.facts.ready):
            return state, ()
        facts = boot.facts
        kv_bytes = boot.learned_used if boot.learned_used is not None else facts.kv_cache_memory_bytes
        boot = replace(boot, ready_at=now, next_health=now + config.health_interval_seconds, phase=Phase.READY)
        # A learned boot whose KV cache is smaller than the profiled one's (vllm issue 57936) is said.
        shrunk = learning.kv_shrink_warning(boot.learned, facts.gpu_kv_cache_tokens) if boot.learned_used else None
        after = replace(
            state,
            stage=Stage.READY,
            boot=boot,
            message=shrunk or (None if boot.unanswered_warned else state.message),
            kv_cache_memory_bytes=kv_bytes,
            compile_cache_hit=facts.compile_cache_hit,
            compile_seconds=facts.compile_seconds,
            wake_at=min(boot.next_health, now + MAX_IDLE_SECONDS),
        )
        learn_baseline = boot.baseline if boot.learned_used is None else None
        if state.swap.since is not None:
            after = replace(after, swap=_swap_done(state.swap, "wake", now))
        warned = () if shrunk is None else (note("kv_cache_smaller_than_profiled", "warning", message=shrunk),)
        return after, (
            *warned,
            # Saved, then ready, then the GPUs free for the next boot: a neighbour starts only after this
            # boot is ready and on disk (all three run before status shows ready).
            RecordBoot(facts, kv_bytes, boot.learned_used is not None, boot.boot_key, learn_baseline),
            note(
                "ready",
                boot_seconds=round(now - boot.started_at, 3),
                kv_cache_memory_bytes=kv_bytes,
                learned_used=boot.learned_used is not None,
                compile_cache_hit=facts.compile_cache_hit,
            ),
            *_woke_by_boot(state, now),
            ReleaseGpus(),
        )
    if event.status == 200 and event.sleeping:
        return _slept_unasked(state, now)
    if event.status == 200:
        return replace(state, boot=replace(boot, unhealthy=0)), ()
    unhealthy = boot.unhealthy + 1
    state = replace(state, boot=replace(boot, unhealthy=unhealthy))
    warn = note("health_failed", "warning", status=event.status, error=event.error, count=unhealthy)
    # 503 is vLLM's own "engine dead"; no answer twice in a row counts the same.
    if event.status == 503 or unhealthy >= 2:
        message = boot.facts.failure_message or f"health check failed ({event.status or event.error})"
        after, commands = _decide_after(
            state, Failure(FailureCause.ENGINE_DEAD, message, boot.facts, served=True), _teardown(state)
        )
        return after, (warn, *commands)
    return state, (warn,)


SLEPT_UNASKED = "the server was put to sleep without dankserve asking (a POST /sleep on its loopback port): woken again"


def _slept_unasked(state: MachineState, now: float) -> Step:
    """A ready server that says it sleeps was slept by someone else: said, and woken (level unknown: the
    staged level-2 wake, which reloads the weights, serves both levels). Its GPU memory was never given
    to another member (the daemon held it awake), so the wake has room."""
    boot = state.boot
    assert boot is not None
    swap = replace(state.swap, level="2", since=now, wake_wanted=False)
    after = replace(state, stage=Stage.WAKING, swap=swap, wake_at=None, message=SLEPT_UNASKED)
    return after, (
        note("slept_unasked", "warning", message=SLEPT_UNASKED),
        note("waking", sleep_level="2"),
        WakeServer(boot.workload_id or "", "2"),
    )


def _on_liveness(state: MachineState, event: LivenessFailed, now: float) -> Step:
    facts = state.facts
    return _decide_after(state, Failure(event.cause, event.message, facts, served=True), _teardown(state))


def _on_member_lost(state: MachineState, event: MemberLost, now: float) -> Step:
    facts = state.facts
    served = state.stage is Stage.READY
    failure = Failure(FailureCause.ENGINE_DEAD, f"a member of the group was lost: {event.reason}", facts, served)
    return _decide_after(state, failure, _teardown(state))  # the group runtime logged group_member_lost


def _on_gpu_tenants(state: MachineState, event: GpuTenants, now: float) -> Step:
    failure = state.pending
    if failure is None:
        return state, ()
    boot = state.boot
    config = state.config
    relearned = False if failure.served else state.relearned
    facts = failure.facts
    context = FailureContext(
        message=failure.message,
        max_model_len_setting=config.max_model_len_setting,
        estimated_max_model_len=facts.estimated_max_model_len if facts else None,
        gpu_memory_utilization_setting=config.gpu_memory_utilization_setting,
        gpu_memory_utilization_planned=boot.planned_utilization if boot else None,
        utilization_band_top=boot.band_top if boot else None,
        remediated=state.remediated,
        learned_kv_in_use=boot is not None and boot.learned_used is not None,
        relearned=relearned,
        # Unknown is not "none": an OOM with unknown tenants waits, it does not drop the learned bytes.
        other_gpu_processes=event.other_processes is not False,
    )
    decision = policy.decide(failure.cause, context)
    failures = (*state.failures, now)
    state = replace(
        state,
        failures=failures,
        relearned=relearned,
        pending=None,
        last_failure=LastFailure(failure.cause.value, failure.message, now),
    )
    commands: list[Command] = [
        RecordFailure(failure.cause.value, failure.message),
        note(
            "boot_failed",
            "warning",
            failure=failure.cause.value,
            action=decision.action.value,
            decision=decision.reason,
        ),
    ]
    if decision.outcome == "config_error":
        after, more = _fail(state, decision.reason, failure.cause.value)
        return after, (*commands, *more)
    if decision.overrides:
        remediated = state.remediated
        if decision.remediation is not None:
            remediated = remediated | {decision.remediation}
        state = replace(state, overrides=state.overrides.with_remediation(decision.overrides), remediated=remediated)
        commands.append(SetRemediation(dict(decision.overrides), tuple(sorted(c.value for c in remediated))))
    if decision.drop_learned_kv and boot is not None and boot.boot_key is not None:
        commands.append(ForgetLearned(boot.boot_key))
        state = replace(state, relearned=True)
    restart = policy.next_restart(
        failures,
        now,
        config.restart,
        lambda a, b: a + (b - a) * event.draw,
        immediate=not decision.backoff,
    )
    if restart.kind == "failed":
        after, more = _fail(state, restart.reason, failure.cause.value)
        return after, (*commands, *more)
    if failure.asleep:
        swap = replace(state.swap, level="stop", since=None, wake_wanted=False)
        after = replace(state, stage=Stage.ASLEEP, boot=None, swap=swap, wake_at=None)
        return after, (*commands, note("asleep_until_woken", reason="its server died while asleep"))
    state = replace(
        state, stage=Stage.BACKOFF, restarts=state.restarts + 1, wake_at=restart.not_before, retry_attempts=0
    )
    return state, (
        *commands,
        RecordRestart(),
        note("restart_scheduled", delay_seconds=round(restart.delay_seconds, 2), reason=restart.reason),
    )


def _on_unreachable(state: MachineState, event: RuntimeUnreachable, now: float) -> Step:
    boot = state.boot
    if state.stage in (Stage.BOOTING, Stage.READY) and boot is not None:
        # The runtime went away, not the deployment: keep probing the server, ask the runtime again later.
        commands: list[Command] = []
        message = state.message
        outage = boot.outage
        if outage is None:
            commands.append(note("runtime_unreachable", "warning", error=event.message, container_id=boot.workload_id))
            message = f"Podman unreachable since {event.clock_text}: {event.message}"
            outage = Outage(since=now, attempts=0, next_try=now)
        attempts = outage.attempts + 1
        outage = replace(
            outage, attempts=attempts, next_try=now + policy.outage_retry_delay(attempts, state.config.restart)
        )
        return replace(state, boot=replace(boot, outage=outage), message=message), tuple(commands)
    return _retry_later(state, event.message, now, cause="runtime_unreachable")


def _on_refused(state: MachineState, event: Refused, now: float) -> Step:
    after, commands = _fail(state, event.message, None)
    return after, (ReleaseGpus(), *commands)


def _on_launcher_lost(state: MachineState, event: LauncherLost, now: float) -> Step:
    """launcher: the one planning kept did not answer: remove it and start a new workload instead."""
    boot = state.boot or Boot(started_at=now)
    lost = boot.launcher_id
    boot = replace(boot, launcher_id=None)
    overrides = replace(state.overrides, kv_cache_memory_bytes=boot.learned_used)
    commands: list[Command] = [note("launcher_lost", "warning", container_id=lost, error=event.message)]
    if lost is not None:
        commands += [StopWorkload(lost), RemoveWorkload(lost, best_effort=True)]
    return replace(state, boot=boot), (*commands, StartWorkload(overrides, state.vllm_version))


def _on_crashed(state: MachineState, event: Crashed, now: float) -> Step:
    facts = state.facts
    return _decide_after(state, Failure(FailureCause.CRASH, event.message, facts, state.stage is Stage.READY), ())


# --- helpers ----------------------------------------------------------------------------------------


def _watch(state: MachineState, now: float) -> Step:
    """A running workload at `now`: the boot deadline, health checks due, a broken log stream."""
    boot = state.boot
    if boot is None or state.stage not in (Stage.BOOTING, Stage.READY):
        return state, ()
    config = state.config
    wid = boot.workload_id or ""
    if boot.log_ended and (boot.outage is None or now >= boot.outage.next_try):
        # The stream ended: the workload exited, or the runtime went away (or both).
        timeout = 1.0 if boot.outage is not None else EXIT_WAIT_SECONDS
        return replace(state, wake_at=now + MAX_IDLE_SECONDS), (WaitExit(wid, timeout, server=boot.server),)
    if state.stage is Stage.BOOTING:
        if now >= boot.deadline:
            message = f"not ready within {config.boot_timeout_seconds:.0f}s"
            warn = note("boot_timeout", "warning", seconds=config.boot_timeout_seconds)
            after, commands = _decide_after(
                state, Failure(FailureCause.BOOT_TIMEOUT, message, boot.facts, False), _teardown(state)
            )
            return after, (warn, *commands)
        wake = min(boot.deadline, now + MAX_IDLE_SECONDS)
        if boot.facts.ready:
            if (
                not boot.unanswered_warned
                and boot.up_logged_at is not None
                and now - boot.up_logged_at >= UNANSWERED_HEALTH_SECONDS
            ):
                message = UNANSWERED_HEALTH_MESSAGE.format(seconds=now - boot.up_logged_at)
                warn = note("health_unanswered", "warning", seconds=round(now - boot.up_logged_at, 1))
                state = replace(state, boot=replace(boot, unanswered_warned=True), message=message)
                boot = state.boot or boot
                if now < boot.next_health:
                    return replace(state, wake_at=min(wake, boot.next_health)), (warn,)
                boot = replace(boot, next_health=now + HEALTH_RETRY_SECONDS)
                return replace(state, boot=boot, wake_at=now + HEALTH_RETRY_SECONDS), (warn, ProbeHealth(1.0))
            if now >= boot.next_health:
                boot = replace(boot, next_health=now + HEALTH_RETRY_SECONDS)
                return replace(state, boot=boot, wake_at=now + HEALTH_RETRY_SECONDS), (ProbeHealth(1.0),)
            wake = min(wake, boot.next_health)
        return replace(state, wake_at=wake), ()
    if now >= boot.next_health:
        boot = replace(boot, next_health=now + config.health_interval_seconds)
        wake = min(boot.next_health, now + MAX_IDLE_SECONDS)
        return replace(state, boot=boot, wake_at=wake), (ProbeHealth(min(2.0, config.health_interval_seconds)),)
    return replace(state, wake_at=min(boot.next_health, now + MAX_IDLE_SECONDS)), ()


def _decide_after(state: MachineState, failure: Failure, teardown: tuple[Command, ...]) -> Step:
    """The workload is being removed (`teardown`); then ask NVML about the GPUs and decide."""
    uuids = state.boot.uuids if state.boot is not None else state.gpu_uuids
    commands = tuple(c for c in teardown if not isinstance(c, ReleaseGpus))
    after = replace(state, stage=Stage.DECIDING, pending=failure, wake_at=None)
    return after, (*commands, ReleaseGpus(), CountGpuTenants(uuids))


def _fail(state: MachineState, message: str, cause: str | None) -> Step:
    after = replace(state, stage=Stage.FAILED, message=message, wake_at=None, pending=None)
    return after, (note("deployment_failed", "error", failure=cause, failure_message=message),)


def _retry_later(state: MachineState, why: str, now: float, cause: str = "retry") -> Step:
    attempts = state.retry_attempts + 1
    delay = policy.outage_retry_delay(attempts, state.config.restart)
    after = replace(
        state,
        stage=Stage.RETRY_WAIT,
        retry_attempts=attempts,
        wake_at=now + delay,
        pending=None,
        port_holder=None,
        message=f"{why}; retrying in {delay:.1f} s",
    )
    # A running workload is left alone: the next boot adopts it if it kept running, else replaces it.
    return after, (ReleaseGpus(), note(cause, "warning", error=why, retry_in_seconds=round(delay, 2)))


# --- swap groups (issue 16) --------------------------------------------------------------------------


def _swap_done(swap: SwapTimes, kind: Literal["sleep", "wake"], now: float) -> SwapTimes:
    """The swap record once a sleep or a wake that began at `swap.since` ended at `now`."""
    seconds = round(now - swap.since, 3) if swap.since is not None else None
    if kind == "sleep":
        return replace(
            swap, since=None, last_sleep_seconds=seconds, last_level=swap.level, last_at=now, last_kind="sleep"
        )
    return replace(
        swap,
        since=None,
        wake_wanted=False,
        last_wake_seconds=seconds,
        last_level=swap.level,
        last_at=now,
        last_kind="wake",
    )


def _woke_by_boot(state: MachineState, now: float) -> tuple[Command, ...]:
    """The log line of a wake done by booting (the member slept by being stopped)."""
    if state.swap.since is None:
        return ()
    return (note("woke_up", sleep_level=state.swap.level, seconds=round(now - state.swap.since, 3)),)


def _on_sleep_requested(state: MachineState, event: SleepRequested, now: float) -> Step:
    wid = state.workload_id or ""
    swap = replace(state.swap, level=event.level, since=now, wake_wanted=False)
    after = replace(state, stage=Stage.FALLING_ASLEEP, swap=swap, wake_at=None)
    server = state.boot.server if state.boot is not None else None
    return after, (
        note("falling_asleep", sleep_level=event.level, reason=event.reason),
        SleepServer(wid, event.level, server=server),
    )


def _on_fell_asleep(state: MachineState, event: FellAsleep, now: float) -> Step:
    swap = state.swap
    commands: list[Command] = [note("fell_asleep", sleep_level=swap.level, seconds=round(event.seconds, 3))]
    swap = replace(_swap_done(swap, "sleep", now), last_sleep_seconds=round(event.seconds, 3))
    after = replace(state, stage=Stage.ASLEEP, swap=swap, wake_at=None)
    if swap.level == "stop":  # the interpreter stopped the server (and removed it, unless a launcher's)
        after = replace(after, boot=None)
        commands.append(ReleaseGpus())
    if state.swap.wake_wanted:
        woken, more = _on_wake_requested(after, WakeRequested(), now)
        return woken, (*commands, *more)
    return after, tuple(commands)


def _on_sleep_unsupported(state: MachineState, event: SleepUnsupported, now: float) -> Step:
    swap = replace(state.swap, level="stop")
    return replace(state, swap=swap), (
        note("sleep_unsupported", "warning", reason=event.reason),
        SleepServer(state.workload_id or "", "stop", server=state.boot.server if state.boot is not None else None),
    )


def _on_wake_requested(state: MachineState, event: WakeRequested, now: float) -> Step:
    if state.stage is Stage.FALLING_ASLEEP:
        return replace(state, swap=replace(state.swap, wake_wanted=True)), ()
    swap = replace(state.swap, since=now, wake_wanted=False)
    wid = state.workload_id
    if state.swap.level == "stop" or wid is None:
        after, commands = _begin_boot(replace(state, swap=replace(swap, level="stop")), now)
        return after, (note("waking", sleep_level="stop"), *commands)
    return replace(state, stage=Stage.WAKING, swap=swap, wake_at=None), (
        note("waking", sleep_level=swap.level),
        WakeServer(wid, swap.level or "1"),
    )


def _on_woke_up(state: MachineState, event: WokeUp, now: float) -> Step:
    boot = state.boot
    swap = replace(_swap_done(state.swap, "wake", now), last_wake_seconds=round(event.seconds, 3))
    after = replace(state, stage=Stage.READY, swap=swap, wake_at=now)
    if boot is not None:
        after = replace(after, boot=replace(boot, next_health=now, unhealthy=0))
    return after, (note("woke_up", sleep_level=state.swap.level, seconds=round(event.seconds, 3)),)


def _on_swap_failed(state: MachineState, event: SleepFailed | WakeFailed, now: float) -> Step:
    kind = "sleep" if isinstance(event, SleepFailed) else "wake"
    swap = replace(state.swap, since=None, wake_wanted=False, level=None)
    failure = Failure(FailureCause.ENGINE_DEAD, f"{kind} failed: {event.message}", state.facts, served=True)
    after, commands = _decide_after(replace(state, swap=swap), failure, _teardown(state))
    return after, (note(f"{kind}_failed", "error", error=event.message), *commands)


_HANDLERS: dict[type, Callable[[MachineState, Any, float], Step]] = {
    Begin: _on_begin,
    StopRequested: _on_stop,
    Reconfigured: _on_reconfigured,
    Tick: _on_tick,
    WeightsProgress: _on_weights_progress,
    WeightsReady: _on_weights_ready,
    WeightsFailed: _on_weights_failed,
    ImageReady: _on_image_ready,
    BootPlanned: _on_boot_planned,
    GpusAcquired: _on_gpus_acquired,
    FreeMemoryRead: _on_free_memory,
    PortBusy: _on_port_busy,
    PortFree: _on_port_free,
    WorkloadStarted: _on_workload_started,
    BootLog: _on_boot_log,
    LogEnded: _on_log_ended,
    Exited: _on_exited,
    StillRunning: _on_still_running,
    HealthChecked: _on_health,
    LivenessFailed: _on_liveness,
    MemberLost: _on_member_lost,
    GpuTenants: _on_gpu_tenants,
    RuntimeUnreachable: _on_unreachable,
    Refused: _on_refused,
    Crashed: _on_crashed,
    LauncherLost: _on_launcher_lost,
    SleepRequested: _on_sleep_requested,
    FellAsleep: _on_fell_asleep,
    SleepUnsupported: _on_sleep_unsupported,
    SleepFailed: _on_swap_failed,
    WakeRequested: _on_wake_requested,
    WokeUp: _on_woke_up,
    WakeFailed: _on_swap_failed,
}


# --- docs -------------------------------------------------------------------------------------------

TABLE_BEGIN = "<!-- state-table:begin (generated from dankserve/supervisor/machine.py; do not edit) -->"
TABLE_END = "<!-- state-table:end -->"


def render_state_table() -> str:
    """The state table of docs/ARCHITECTURE.md: every stage, what it shows, and the events it allows."""
    probe = MachineState(MachineConfig(RestartSettings(1, 1, 1, 0, 1, 1)))
    lines = [
        TABLE_BEGIN,
        "",
        "| state | `status` state / phase | allowed events → next state | ignored |",
        "|---|---|---|---|",
    ]
    for stage in Stage:
        shown = replace(probe, stage=stage)
        allowed = []
        ignored = []
        for kind in EVENT_TYPES:
            rule = TRANSITIONS[stage, kind]
            if rule.kind == "allowed":
                targets = ", ".join(f"`{s.value}`" for s in rule.to)
                extra = f" ({rule.note})" if rule.note else ""
                allowed.append(f"`{kind.__name__}` → {targets}{extra}")
            elif rule.kind == "ignored":
                ignored.append(f"`{kind.__name__}`")
        phase = "the log's (starting … capturing)" if stage in (Stage.BOOTING, Stage.ENDING) else shown.phase.value
        lines.append(
            f"| `{stage.value}` | {shown.status} / {phase} | {'; '.join(allowed) or '-'} | "
            f"{', '.join(ignored) or '-'} |"
        )
    lines += [
        "",
        "Any event not listed for a state is refused: the state stays and `event_refused` is logged.",
        "",
        TABLE_END,
    ]
    return "\n".join(lines)


def with_state_table(document: str) -> str:
    """`document` with the text between the table markers replaced by the current table."""
    start = document.index(TABLE_BEGIN)
    end = document.index(TABLE_END) + len(TABLE_END)
    return document[:start] + render_state_table() + document[end:]


def main(argv: Sequence[str]) -> int:
    """Print the state table, or rewrite it in place with `--write FILE`."""
    if len(argv) == 2 and argv[0] == "--write":
        with open(argv[1], encoding="utf-8") as source:
            text = source.read()
        with open(argv[1], "w", encoding="utf-8") as out:
            out.write(with_state_table(text))
        return 0
    sys.stdout.write(render_state_table() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
