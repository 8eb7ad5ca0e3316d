"""When a swap group member sleeps suspended (issue 41 item 7), pure: level 1, then a GPU checkpoint of its
CUDA processes, so it leaves 0 bytes on the GPU instead of its CUDA context, graphs and pools (1.1 to 1.4 GiB
per sleeper measured on the H200).

Suspend is taken where it is asked for (`sleep_level = "suspend"`), or, with `sleep_level = "auto"` and level 1
chosen by RAM, when memory is tight: on a GPU the sleeper shares with the member it makes room for, that
member awake (its `gpu_memory_utilization` of the GPU) beside the members that stay awake and what every
sleeper keeps (the others' as NVML or the stand-in's records show it now, this one's its CUDA context) would
not fit. Never where the GPU checkpoint cannot run here (no cuda-bindings on a GPU host: the reason says so);
then level 1, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dankserve.supervisor.fleet.swap import LevelChoice, SleepLevel

_GIB = 1 << 30


@dataclass(frozen=True)
class GpuShare:
    """One GPU the sleeper shares with the member it makes room for, as the choice sees it."""

    uuid: str
    total_bytes: int
    waker_bytes: int
    """The member woken (or booted), awake: its share of the GPU."""
    awake_bytes: int
    """The members that stay awake (or are waking, booting), neither the sleeper nor the woken one."""
    asleep_bytes: int
    """What the other sleeping members hold now (NVML, or the stand-in's records)."""
    sleeper_bytes: int
    """What the sleeper would keep at level 1 (its CUDA context)."""


def tight(gpus: Sequence[GpuShare]) -> str | None:
    """Why the woken member would not fit beside the sleepers' leftovers (the first such GPU), else None."""
    for gpu in gpus:
        left = gpu.asleep_bytes + gpu.sleeper_bytes
        if gpu.waker_bytes + gpu.awake_bytes + left > gpu.total_bytes:
            return (
                f"on GPU {gpu.uuid} the woken member's {_gib(gpu.waker_bytes)} beside {_gib(gpu.awake_bytes)} awake "
                f"and {_gib(left)} kept by sleepers exceed its {_gib(gpu.total_bytes)}"
            )
    return None


def choose(base: LevelChoice, setting: str, *, unavailable: str | None, tight_reason: str | None) -> LevelChoice:
    """The level once suspend is considered: `base` is RAM's (or the setting's) choice; suspend only upgrades
    level 1 (it is level 1 and a checkpoint), asked for (`setting`) or where memory is tight."""
    if base.level is not SleepLevel.LEVEL_1 or (setting != "suspend" and tight_reason is None):
        return base
    why = "sleep_level = suspend (set in config)" if setting == "suspend" else f"memory is tight: {tight_reason}"
    if unavailable is not None:
        return LevelChoice(
            SleepLevel.LEVEL_1, f"{why}, but the GPU checkpoint is unavailable here ({unavailable}): level 1"
        )
    return LevelChoice(SleepLevel.SUSPEND, f"{why}: suspended (level 1, then a GPU checkpoint: 0 bytes on the GPU)")


@dataclass(frozen=True)
class SuspendReadings:
    """What the choice reads now (the daemon's GPU reader and checkpoint edge; the coordinator asks)."""

    unavailable: Callable[[], str | None]
    """Why the GPU checkpoint cannot run here (None: it can)."""
    totals: Callable[[Sequence[str]], Mapping[str, int]]
    """Each GPU's total bytes."""
    held: Callable[[str], Mapping[str, int] | None]
    """What a deployment's server processes hold on each of its GPUs now (None: unreadable)."""


def _gib(value: int) -> str:
    return f"{value / _GIB:.2f} GiB"
