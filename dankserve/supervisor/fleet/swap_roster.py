"""The swap groups' roster: who is in which group (configuration order, enabled, not taken down), and what
the coordinator keeps of each member between looks (its last use, requests in flight, its latest plan's
facts), turned into the `swap.Member`s the pure decisions take."""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from dankserve.plan.rules import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
from dankserve.supervisor import machine as m
from dankserve.supervisor.fleet.swap import Member, MemberState
from dankserve.supervisor.fleet.swap_fit import fit_facts

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

    def used(self, name: str, now: float, *, unless_known: bool = False) -> None:
        """`name` counts as used at `now` (woken; or, `unless_known`, ready with no use recorded yet)."""
        with self._lock:
            if not unless_known or name not in self._last_used:
                self._last_used[name] = now

    def record_plan(self, name: str, facts: PlanFacts) -> None:
        with self._lock:
            self._facts[name] = facts

    def facts(self, name: str) -> PlanFacts | None:
        with self._lock:
            return self._facts.get(name)

    def members(
        self, group: str, admitted: Collection[str], *, target: str | None = None, target_gpus: tuple[str, ...] = ()
    ) -> list[Member]:
        """The group's members now, as the decisions see them; `target` (a boot asking for room) counts as
        asleep on `target_gpus`."""
        workers = self.fleet.snapshot()
        deps = self.fleet.settings.deployments
        out = []
        for name in self.names(group):
            worker = workers.get(name)
            if worker is None:
                continue
            machine = worker.machine
            with self._lock:
                facts = self._facts.get(name)
                last_used = self._last_used.get(name, 0.0)
                in_flight = self._in_flight.get(name, 0)
            gpus = frozenset(target_gpus if name == target else machine.gpu_uuids)
            state = MemberState.ASLEEP if name == target else member_state(machine.stage, name in admitted)
            share = utilization(facts, deps[name].gpu_memory_utilization)
            fit = fit_facts(machine, deps[name], self.fleet.state.deployment(name))
            out.append(Member(name, gpus, share, state, last_used, in_flight, deps[name].pinned, *fit))
        return out
