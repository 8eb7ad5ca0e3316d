"""A deployment's lifecycle: the named phases and the pure rules that move between them.

Phases appear in `dankserve status` and in systemd's STATUS= line. The daemon feeds boot-log
events and runtime events in; these functions say which phase follows and whether the
deployment counts as settled for systemd's READY=1 (ready, or definitively failed/stopped).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class Phase(StrEnum):
    """Where a deployment is in its life."""

    PROBING = "probing"
    DOWNLOADING = "downloading"
    PLANNING = "planning"
    PULLING = "pulling"
    STARTING = "starting"
    LOADING = "loading"
    COMPILING = "compiling"
    PROFILING = "profiling"
    CAPTURING = "capturing"
    WARMING = "warming"
    """Up, and sent the served request shapes once before READY (the first request's kernel compile)."""
    READY = "ready"
    RESTARTING = "restarting"
    FAILED = "failed"
    STOPPED = "stopped"
    # Swap groups (issue 16): a member put to sleep to let another use its GPUs.
    FALLING_ASLEEP = "falling_asleep"
    ASLEEP = "asleep"
    WAKING = "waking"
    # Snapshots (issue 41): the ready server captured once per plan; requests wait meanwhile.
    SNAPSHOTTING = "snapshotting"


BOOTING_PHASES = frozenset(
    {
        Phase.PROBING,
        Phase.DOWNLOADING,
        Phase.PLANNING,
        Phase.PULLING,
        Phase.STARTING,
        Phase.LOADING,
        Phase.COMPILING,
        Phase.PROFILING,
        Phase.CAPTURING,
        Phase.WARMING,
        Phase.RESTARTING,
    }
)
SETTLED_PHASES = frozenset({Phase.READY, Phase.FAILED, Phase.STOPPED, Phase.ASLEEP, Phase.SNAPSHOTTING})
"""Snapshotting counts: the server was ready and is ready again within seconds (requests wait meanwhile)."""

# Boot phases only move forward: a late log line of an earlier phase must not move status back.
_BOOT_ORDER = (Phase.STARTING, Phase.LOADING, Phase.COMPILING, Phase.PROFILING, Phase.CAPTURING, Phase.READY)


def advance_boot_phase(current: Phase, reported: Phase) -> Phase:
    """The phase after a boot-log event reporting `reported` while in `current`."""
    if current not in _BOOT_ORDER or reported not in _BOOT_ORDER:
        return current
    return reported if _BOOT_ORDER.index(reported) > _BOOT_ORDER.index(current) else current


def all_settled(phases: Mapping[str, Phase]) -> bool:
    """Every deployment is ready or definitively failed or stopped (systemd READY=1 time)."""
    return all(phase in SETTLED_PHASES for phase in phases.values())


@dataclass(frozen=True)
class StatusLine:
    """systemd's one-line STATUS= text for the current phases."""

    text: str


def status_line(phases: Mapping[str, Phase], weights_percent: Mapping[str, int | None]) -> StatusLine:
    """A compact summary such as `chat: loading 40%, embed: ready`."""
    if not phases:
        return StatusLine("no deployments configured")
    parts = []
    for name in sorted(phases):
        phase = phases[name]
        pct = weights_percent.get(name)
        suffix = f" {pct}%" if phase in (Phase.LOADING, Phase.DOWNLOADING) and pct is not None else ""
        parts.append(f"{name}: {phase.value}{suffix}")
    return StatusLine(", ".join(parts))
