"""What the upgrade's driver saw: each answer to an action."""

from __future__ import annotations

from dataclasses import dataclass

from dankserve.supervisor.upgrade.judging import Measurement
from dankserve.supervisor.upgrade.steps import Room


@dataclass(frozen=True)
class PullProgressed:
    percent: float


@dataclass(frozen=True)
class Pulled:
    digest: str | None


@dataclass(frozen=True)
class PullFailed:
    reason: str


@dataclass(frozen=True)
class VersionRead:
    version: str | None
    """None: neither a label nor `vllm --version` told."""


@dataclass(frozen=True)
class Replanned:
    gone: tuple[str, ...]
    """Planned flags the new release does not accept (empty: the plan holds)."""
    problem: str | None = None
    """The planner refused the deployment for this release (its message)."""
    changes: tuple[str, ...] = ()
    """What the new release's plan changes against the running one (`judging.plan_changes`)."""


@dataclass(frozen=True)
class OldMeasured:
    measurement: Measurement


@dataclass(frozen=True)
class RoomMade:
    room: Room
    why: str
    """Why this way (host RAM holds the weights at level 1, or not)."""


@dataclass(frozen=True)
class NewBooted:
    workload: str


@dataclass(frozen=True)
class NewFailed:
    reason: str
    workload: str | None = None
    """The failed server's workload, when one was started (it is removed on the way back)."""


@dataclass(frozen=True)
class Measured:
    new: Measurement


@dataclass(frozen=True)
class OldStopped:
    """The old server is stopped and removed (its image is kept for rollback)."""


@dataclass(frozen=True)
class NewStopped:
    """The new server is stopped and removed."""


@dataclass(frozen=True)
class OldRestored:
    """The old server serves again (woken, or booted again when it was stopped)."""


Event = (
    PullProgressed
    | Pulled
    | PullFailed
    | VersionRead
    | Replanned
    | OldMeasured
    | RoomMade
    | NewBooted
    | NewFailed
    | Measured
    | OldStopped
    | NewStopped
    | OldRestored
)
