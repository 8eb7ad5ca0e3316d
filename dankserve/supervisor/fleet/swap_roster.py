"""The swap groups' roster: who is in which group (configuration order, enabled, not taken down), and what
the gateway and the workers tell of each member between looks (its last use, requests in flight, its latest
plan's facts), read by the fleet coordinator into the `coordinate.FleetView` the pure decisions take."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from dankserve.plan.rules import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
from dankserve.supervisor import machine as m
from dankserve.supervisor.fleet.swap import MemberState

if TYPE_CHECKING:
    from dankserve.settings import Settings
    from dankserve.supervisor.records import StateBook

HOLDING_STAGES = frozenset(
    {m.Stage.MEASURING, m.Stage.STARTING, m.Stage.BOOTING, m.Stage.ENDING, m.Stage.WAKING}
)  # a boot past its GPU slot, or a wake: holds (or is about to hold) its GPU memory


@dataclass(frozen=True)
class PlanFacts:
    """What a member's latest plan says that swapping needs (recorded by its worker)."""

    utilization: float
    weights_bytes: int | None
    sleep_mode: bool
    """The plan passes --enable-sleep-mode (the release has it: the catalogue)."""


class SwapMember(Protocol):
    """What swap groups read of a deployment's worker, and send it."""

    @property
    def name(self) -> str: ...

    @property
    def machine(self) -> m.MachineState: ...

    def feed(self, event: m.Event) -> None: ...


class SwapFleet(Protocol):
    """What swap groups read of the daemon (its `Fleet`): the settings it runs with, its workers, who is down."""

    @property
    def settings(self) -> Settings: ...

    @property
    def state(self) -> StateBook: ...

    def snapshot(self) -> Mapping[str, SwapMember]: ...


def member_state(stage: m.Stage, admitted: bool) -> MemberState:
    """A member's state for the decisions: a boot let past admission counts as holding its GPU memory."""
    if stage is m.Stage.READY:
        return MemberState.AWAKE
    if stage in HOLDING_STAGES or admitted:
        return MemberState.WAKING
    if stage is m.Stage.FALLING_ASLEEP:
        return MemberState.SLEEPING
    if stage is m.Stage.ASLEEP:
        return MemberState.ASLEEP
    return MemberState.STOPPED


def utilization(facts: PlanFacts | None, setting: float | None) -> float:
    """A member's share of its GPUs: its plan's; not planned yet, its setting, else what vLLM takes without one."""
    if facts is not None:
        return facts.utilization
    return setting if setting is not None else VLLM_DEFAULT_GPU_MEMORY_UTILIZATION


class Roster:
    """The members of every swap group of one fleet, and their use (thread-safe)."""

    def __init__(self, fleet: SwapFleet) -> None:
        self.fleet = fleet
        self._lock = threading.Lock()
        self._last_used: dict[str, float] = {}
        self._in_flight: dict[str, int] = {}
        self._facts: dict[str, PlanFacts] = {}

    def group_of(self, name: str) -> str | None:
        dep = self.fleet.settings.deployments.get(name)
        return dep.swap_group if dep is not None else None

    def names(self, group: str) -> list[str]:
        """The group's enabled, not taken-down members, in configuration order."""
        fleet = self.fleet
        return [
            name
            for name, dep in fleet.settings.deployments.items()
            if dep.swap_group == group and dep.enabled and not fleet.state.is_down(name)
        ]

    def touched(self, name: str, now: float) -> None:
        """A request went to `name`."""
        with self._lock:
            self._last_used[name] = now
            self._in_flight[name] = self._in_flight.get(name, 0) + 1

    def released(self, name: str, now: float) -> None:
        """A request to `name` ended."""
        with self._lock:
            self._last_used[name] = now
            self._in_flight[name] = max(0, self._in_flight.get(name, 0) - 1)

    def in_flight(self, name: str) -> int:
        """Requests sent to `name` that have not ended."""
        with self._lock:
            return self._in_flight.get(name, 0)

    def use(self, name: str) -> tuple[float, int]:
        """`name`'s last request start or end (0: none yet) and its requests in flight."""
        with self._lock:
            return self._last_used.get(name, 0.0), self._in_flight.get(name, 0)

    def record_plan(self, name: str, facts: PlanFacts) -> None:
        with self._lock:
            self._facts[name] = facts

    def facts(self, name: str) -> PlanFacts | None:
        with self._lock:
            return self._facts.get(name)
