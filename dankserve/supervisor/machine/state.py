"""What the machine knows of one deployment (frozen): `MachineState` and its parts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from dankserve.bootlog.facts import BootFacts
from dankserve.state import LearnedKv
from dankserve.supervisor.lifecycle import Phase
from dankserve.supervisor.machine.stages import (
    PREPARING,
    SLEEP_STAGES,
    STAGE_PHASE,
    STAGE_STATUS,
    SWAP_MOVES,
    SleepLevel,
    Stage,
    StatusState,
    SwapMove,
)
from dankserve.supervisor.policy import FailureCause, RestartSettings


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


SnapshotState = Literal["ready", "absent", "off"]


@dataclass(frozen=True)
class SnapshotPlan:
    """What planning found of the deployment's snapshot (issue 41): `ready` (valid for this plan: the boot
    restores it), `absent` (none, or one discarded: the ready boot captures one), `off` (never: the
    setting, the runtime, CRIU missing ...), and why."""

    state: SnapshotState
    reason: str
    discarded: str | None = None
    """Why planning deleted the snapshot there was (a changed plan, a corrupt entry), else None."""
    whole: bool = False
    """Of the whole workload (a Podman container): a launcher's container is captured and restored with its
    launcher and zygote, so a launcher boot captures and a restart through a kept launcher restores."""


@dataclass(frozen=True)
class SnapshotTimes:
    """What status shows of the deployment's snapshots: the last verdict, the last capture's outage and
    restore's seconds, and the last failure (a capture that failed, a snapshot discarded at restore)."""

    plan: SnapshotPlan | None = None
    last_capture_outage_seconds: float | None = None
    last_restore_seconds: float | None = None
    last_failure: str | None = None
    capture_retries: int = 0
    """Captures tried again after a passing failure, since this daemon started (bounded)."""
    capture_lost: str | None = None
    """Why a capture lost the server (its dump ended the tree, the restore from the image failed): this
    daemon does not capture the deployment again (a loop of lost servers), until it restarts."""
    capture_too_big: str | None = None
    """Why a capture's image would not fit (the disk budget, the free disk): not captured again by this daemon
    (each try holds requests through a GPU checkpoint of the whole memory), until it restarts."""


@dataclass(frozen=True)
class Boot:
    """One boot: from planning until its workload is gone."""

    started_at: float
    uuids: tuple[str, ...] = ()
    boot_key: str | None = None
    learned: LearnedKv | None = None
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
    warm_up_since: float | None = None
    """When the warm-up before READY was sent (None: not yet)."""
    # launcher
    launcher_id: str | None = None
    """A running launcher (kept from an earlier boot) that starts this boot's server."""
    server: int | None = None
    """This boot's server number in its launcher (None: the workload is the server itself)."""
    # snapshots (issue 41)
    snapshot: SnapshotPlan | None = None
    """What planning found of the snapshot (None: not asked, e.g. an adopted server)."""
    restored: bool = False
    """This boot is a snapshot's restore (boot kind `restore`)."""
    capture_due: bool = False
    """Ready without a valid snapshot: capture one at the next look around."""
    capture_after: float = 0.0
    """Not before then (a capture tried again after a passing failure)."""


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
    suspend_failure: str | None = None
    """Why the last suspend slept at plain level 1 instead (None: it did not fail; cleared by the next sleep)."""


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
    image_digest: str | None = None
    """The digest of the image the last boot ran (an upgrade's auto-update compares it with the local one)."""
    image_entrypoint: tuple[str, ...] | None = None
    """The entrypoint of the image the last boot ran, read from its config (Podman; None: not read yet): what
    `launcher = "auto"` decides by (DeploymentSettings.with_image_entrypoint)."""
    gpu_uuids: tuple[str, ...] = ()
    kv_cache_memory_bytes: int | None = None
    kv_cache_learned_used: bool = False
    compile_cache_hit: bool | None = None
    compile_seconds: float | None = None
    swap: SwapTimes = SwapTimes()
    """Swap groups (issue 16): sleep level and timings."""
    snapshot: SnapshotTimes = SnapshotTimes()
    """Snapshots (issue 41): the last verdict and timings, for status."""
    port_holder: str | None = None
    """Who holds the deployment's port while RETRY_WAIT waits for it (CheckPort every PORT_RECHECK_SECONDS)."""

    @property
    def phase(self) -> Phase:
        """The lifecycle phase `status` and systemd's STATUS= show."""
        if self.stage in (Stage.BOOTING, Stage.ENDING):
            return self.boot.phase if self.boot is not None else Phase.STARTING
        return STAGE_PHASE[self.stage]

    @property
    def status(self) -> StatusState:
        """The `state` field of `dankserve status`."""
        if self.swap.since is not None and (self.stage in PREPARING or self.stage is Stage.BOOTING):
            return "waking"  # a swap group member that sleeps by stopping boots to wake
        return STAGE_STATUS.get(self.stage, "starting")

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
