"""Groups from fit (issue 29 item 3), pure: members with `swap_group = "auto"` and no hand-set
`gpu_memory_utilization` share their GPUs by their planned bytes, so several small models stay awake
at once and a large one alone; which awake member makes room is chosen by measured cost and recency,
never one still inside its `min_awake_seconds` (no thrash) nor one with requests in flight.

`make_room` (swap.py) asks `evictable` which awake members may go now and `eviction_order` in what
order; the supervisor hands in each member's predicted cost to bring it back (its wake seconds from
history, or its boot seconds when it sleeps by stopping: prediction.py) and when it became awake.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

from dankserve.supervisor.observe.prediction import predict

if TYPE_CHECKING:
    from dankserve.settings import DeploymentSettings, Settings
    from dankserve.state import DeploymentState
    from dankserve.supervisor.machine import MachineState

AUTO_GROUP = "auto"
"""The swap_group that asks the daemon to group members by fit (one per set of shared GPUs)."""
UNKNOWN_COST_SECONDS = 1.0
"""The cost assumed for a member without history (a first wake): as dear as a typical level-1 wake."""


class Evictable(Protocol):
    """What the eviction rules read of a member (swap.Member)."""

    @property
    def name(self) -> str: ...
    @property
    def last_used(self) -> float: ...
    @property
    def wake_cost_seconds(self) -> float | None: ...
    @property
    def resident_until(self) -> float: ...


M = TypeVar("M", bound=Evictable)


def resident(member: Evictable, now: float | None) -> bool:
    """Still inside its minimum residency: not put to sleep to make room yet."""
    return now is not None and member.resident_until > now


def eviction_order(candidates: Sequence[M], now: float | None) -> list[M]:
    """Who makes room first: the member cheapest to bring back per second it has been idle (a
    GreedyDual-like rule: an expensive member used a moment ago stays; a cheap, long idle one goes).
    Without a clock (or costs) this is least recently used first, as before."""
    if now is None:
        return sorted(candidates, key=lambda m: (m.last_used, m.name))

    def key(m: M) -> tuple[float, float, str]:
        idle = max(0.0, now - m.last_used)
        cost = m.wake_cost_seconds if m.wake_cost_seconds is not None else UNKNOWN_COST_SECONDS
        return (cost / (idle + 1.0), m.last_used, m.name)

    return sorted(candidates, key=key)


def wake_cost_seconds(record: DeploymentState, level: str | None) -> float | None:
    """What bringing the member back costs, from its history: its wake, or its boot when it sleeps by stop."""
    predicted = predict(record.timings)
    if level == "stop":
        return predicted.warm if predicted.warm is not None else predicted.cold
    return predicted.wake


def resident_until(machine: MachineState, min_awake_seconds: float | None) -> float:
    """When the member's minimum residency ends (monotonic; 0: none, or not awake)."""
    if not min_awake_seconds:
        return 0.0
    boot = machine.boot
    since = machine.wake_at or (boot.ready_at if boot is not None else None)
    return 0.0 if since is None else since + min_awake_seconds


def sleeps_after_first_boot(settings: Settings, name: str) -> bool:
    """Whether start-up puts the member to sleep once its first boot is done: not in an `auto` group,
    whose members stay awake while they fit (a later boot or wake makes room as it needs)."""
    dep = settings.deployments.get(name)
    return dep is None or dep.swap_group != AUTO_GROUP


def fit_facts(machine: MachineState, dep: DeploymentSettings, record: DeploymentState) -> tuple[float | None, float]:
    """A member's cost to bring back and the end of its residency (swap.Member's last two fields)."""
    return wake_cost_seconds(record, machine.swap.level), resident_until(machine, dep.min_awake_seconds)
