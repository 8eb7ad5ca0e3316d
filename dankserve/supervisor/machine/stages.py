"""The machine's stages (h11's states): what `status` shows derives from them."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Literal, get_args

from dankserve.supervisor.lifecycle import Phase


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
    # Snapshots (issue 41): this one only follows READY.
    SNAPSHOTTING = "snapshotting"
    """The ready server is captured (sleep, GPU checkpoint, `criu dump --leave-running`, wake, canary):
    the gateway holds its requests, as during a wake."""


TERMINAL = frozenset({Stage.FAILED, Stage.STOPPED})
RUNNING = frozenset({Stage.BOOTING, Stage.READY, Stage.ENDING, Stage.SNAPSHOTTING})
"""Stages in which a workload of this deployment runs and is followed."""
PREPARING = frozenset(
    {Stage.DOWNLOADING, Stage.PULLING, Stage.PLANNING, Stage.WAITING_GPUS, Stage.MEASURING, Stage.STARTING}
)
SLEEP_STAGES = frozenset({Stage.FALLING_ASLEEP, Stage.ASLEEP, Stage.WAKING})
"""Swap groups' stages: a workload runs in them unless the member sleeps by being stopped (`swap.level` stop)."""
BOOT_PHASES = (Phase.STARTING, Phase.LOADING, Phase.COMPILING, Phase.PROFILING, Phase.CAPTURING, Phase.WARMING)

STAGE_PHASE: dict[Stage, Phase] = {
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
    Stage.SNAPSHOTTING: Phase.SNAPSHOTTING,
}
StatusState = Literal[
    "starting", "ready", "restarting", "failed", "stopped", "falling_asleep", "asleep", "waking", "snapshotting"
]
STAGE_STATUS: dict[Stage, StatusState] = {
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
    Stage.SNAPSHOTTING: "snapshotting",
}

SleepLevel = Literal["1", "2", "stop", "suspend"]
"""vLLM's sleep level 1 (weights to CPU RAM), 2 (weights dropped), stop and boot (no sleep mode), or suspend
(level 1, then a GPU checkpoint of the server's CUDA processes: 0 bytes left on the GPU; issue 41 item 7)."""
SLEEP_LEVELS: Mapping[str, SleepLevel] = {level: level for level in get_args(SleepLevel)}
"""Each sleep level by its name (as the state file keeps it)."""
SwapMove = Literal["falling_asleep", "waking"]
"""A sleep or a wake under way (the stages' names)."""
SWAP_MOVES: Mapping[str, SwapMove] = {move: move for move in get_args(SwapMove)}
"""Each move by its name (as the state file keeps it)."""
