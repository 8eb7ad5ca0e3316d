"""What the upgrade asks its driver to do next."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pull:
    image: str


@dataclass(frozen=True)
class ReadVersion:
    image: str


@dataclass(frozen=True)
class Replan:
    image: str
    version: str | None


@dataclass(frozen=True)
class MeasureOld:
    """The fixed request against the old server while it still serves: its figures to compare with."""


@dataclass(frozen=True)
class MakeRoom:
    """Put the old server to sleep at level 1 when host RAM holds it, else stop it."""


@dataclass(frozen=True)
class BootNew:
    image: str
    version: str | None


@dataclass(frozen=True)
class Measure:
    """The fixed request against the new server: KV capacity, decode tokens/s, greedy ids."""

    workload: str


@dataclass(frozen=True)
class StopOld:
    """Stop and remove the old server; its image stays for `rollback`."""


@dataclass(frozen=True)
class StopNew:
    workload: str | None
    """None: find it by the deployment's upgrade label (a daemon killed before it learned the id)."""


@dataclass(frozen=True)
class RestoreOld:
    room: str | None
    """"1": wake it; "stop": boot it again; None: it was never touched (nothing to do but serve)."""


Action = Pull | ReadVersion | Replan | MeasureOld | MakeRoom | BootNew | Measure | StopOld | StopNew | RestoreOld
