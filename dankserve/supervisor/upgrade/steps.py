"""An upgrade's steps and its state (frozen): what status shows and state.json keeps."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Literal

from dankserve.state import UpgradeRecord
from dankserve.supervisor.upgrade.judging import DEFAULT_LIMITS, Limits, Measurement


class Step(Enum):
    """Where an upgrade stands; the value is the word status, the log and state.json use."""

    PULLING = "pulling"
    READING_VERSION = "reading_version"
    REPLANNING = "replanning"
    MAKING_ROOM = "making_room"
    BOOTING = "booting"
    CHECKING = "checking"
    SWITCHING = "switching"
    ROLLING_BACK = "rolling_back"
    SWITCHED = "switched"
    ROLLED_BACK = "rolled_back"
    REFUSED = "refused"


TERMINAL = frozenset({Step.SWITCHED, Step.ROLLED_BACK, Step.REFUSED})

BEFORE_ROOM = frozenset({Step.PULLING, Step.READING_VERSION, Step.REPLANNING})
"""Steps in which the old server still serves untouched: nothing to undo."""

Room = Literal["1", "stop"]
"""How the old server made room: asleep at level 1 (its weights in host RAM), or stopped."""


@dataclass(frozen=True)
class UpgradeState:
    """One upgrade of one deployment."""

    deployment: str
    old_image: str
    new_image: str
    started_at: float
    step: Step = Step.PULLING
    old_version: str | None = None
    new_version: str | None = None
    room: Room | None = None
    new_workload: str | None = None
    reason: str | None = None
    pull_percent: float | None = None
    report: dict[str, Any] = field(default_factory=dict)
    limits: Limits = DEFAULT_LIMITS
    old_measurement: Measurement | None = None
    old_digest: str | None = None
    """The digest of the image the old server runs (None: not known)."""
    if_newer: bool = False
    """Auto-update: the pulled image's digest equal to the old one's ends the upgrade (up to date)."""

    def at(self, step: Step, **changes: Any) -> UpgradeState:
        return replace(self, step=step, **changes)

    @property
    def done(self) -> bool:
        return self.step in TERMINAL

    def to_record(self) -> UpgradeRecord:
        """The state.json form (status shows it; the pull's percentage under report while pulling)."""
        report = dict(self.report)
        if self.step is Step.PULLING and self.pull_percent is not None:
            report["pull_percent"] = self.pull_percent
        return UpgradeRecord(
            step=self.step.value,
            old_image=self.old_image,
            new_image=self.new_image,
            started_at=self.started_at,
            old_version=self.old_version,
            new_version=self.new_version,
            room=self.room,
            new_workload=self.new_workload,
            reason=self.reason,
            report=report,
        )

    @classmethod
    def from_record(cls, deployment: str, record: UpgradeRecord, limits: Limits = DEFAULT_LIMITS) -> UpgradeState:
        room: Room | None = "1" if record.room == "1" else "stop" if record.room == "stop" else None
        return cls(
            deployment=deployment,
            old_image=record.old_image,
            new_image=record.new_image,
            started_at=record.started_at,
            step=Step(record.step),
            old_version=record.old_version,
            new_version=record.new_version,
            room=room,
            new_workload=record.new_workload,
            reason=record.reason,
            report=dict(record.report),
            limits=limits,
        )

    def to_json(self) -> dict[str, Any]:
        """What status shows."""
        out = self.to_record().to_json()
        out["deployment"] = self.deployment
        if self.pull_percent is not None and self.step is Step.PULLING:
            out["pull_percent"] = self.pull_percent
        return out
