"""Tests for dankserve.supervisor.fleet.swap_roster: members in configuration order and as the decisions see them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dankserve.plan.rules import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
from dankserve.settings import Settings
from dankserve.state import DeploymentState
from dankserve.supervisor import machine as m
from dankserve.supervisor.fleet.coordinate import FleetState, members_of
from dankserve.supervisor.fleet.coordinator import FleetCoordinator
from dankserve.supervisor.fleet.swap import MemberState
from dankserve.supervisor.fleet.swap_roster import PlanFacts, Roster, member_state, utilization
from dankserve.supervisor.policy import RestartSettings
from dankserve.testing.lifecycle import FakeClock

CONFIG = m.MachineConfig(RestartSettings(1, 1, 1, 0, 1, 1))


@dataclass
class Worker:
    name: str
    machine: m.MachineState

    def feed(self, event: m.Event) -> None:
        raise AssertionError("the roster sends nothing")


class State:
    def __init__(self, down: set[str]) -> None:
        self.down = down

    def is_down(self, name: str) -> bool:
        return name in self.down

    def deployment(self, name: str) -> DeploymentState:
        return DeploymentState()  # no history: no measured cost to bring a member back


@dataclass
class Fleet:
    settings: Settings
    workers: dict[str, Worker]
    state: Any = field(default_factory=lambda: State(set()))

    def snapshot(self) -> dict[str, Any]:
        return dict(self.workers)


def fleet(down: frozenset[str] = frozenset()) -> Fleet:
    deployments = {
        "b": {"model": "m", "port": 8001, "swap_group": "g", "gpu_memory_utilization": 0.6},
        "a": {"model": "m", "port": 8002, "swap_group": "g", "pinned": True},
        "off": {"model": "m", "port": 8003, "swap_group": "g", "enabled": False},
        "solo": {"model": "m", "port": 8004},
    }
    settings = Settings(state_dir="/nonexistent", deployments=deployments)
    workers = {
        name: Worker(name, m.MachineState(CONFIG, stage=m.Stage.READY, gpu_uuids=("GPU-0",)))
        for name in ("a", "b", "solo")
    }
    return Fleet(settings, workers, State(set(down)))


def test_a_group_lists_its_enabled_members_in_configuration_order() -> None:
    """Disabled and taken-down members are left out; a deployment outside a group is in none."""
    roster = Roster(fleet())
    assert roster.names("g") == ["b", "a"]
    assert roster.group_of("solo") is None and roster.group_of("nope") is None
    assert Roster(fleet(frozenset({"b"}))).names("g") == ["a"]


def test_members_carry_their_use_and_share_into_the_coordinators_view() -> None:
    """Requests in flight never go below 0; the plan's share wins over the setting; pinned is the setting's."""
    fleet_ = fleet()
    coordinator = FleetCoordinator(fleet_, lambda: None, FakeClock())
    roster = coordinator._roster
    roster.touched("b", 5.0)
    roster.released("b", 6.0)
    roster.released("b", 7.0)
    assert roster.use("b") == (7.0, 0)
    roster.record_plan("a", PlanFacts(0.3, None, sleep_mode=True))
    members = {member.name: member for member in members_of(FleetState(), coordinator._view(), "g")}
    assert members["b"].in_flight == 0 and members["b"].last_used == 7.0 and members["b"].utilization == 0.6
    assert members["a"].utilization == 0.3 and members["a"].pinned and members["a"].state is MemberState.AWAKE
    assert list(members) == ["b", "a"]


def test_a_member_state_follows_its_stage_and_admission() -> None:
    """A boot let past admission holds its GPU memory before it starts; settings give the share until a plan does."""
    assert member_state(m.Stage.READY, False) is MemberState.AWAKE
    assert member_state(m.Stage.PLANNING, True) is MemberState.WAKING
    assert member_state(m.Stage.PLANNING, False) is MemberState.STOPPED
    assert member_state(m.Stage.FALLING_ASLEEP, False) is MemberState.SLEEPING
    assert member_state(m.Stage.ASLEEP, False) is MemberState.ASLEEP
    assert utilization(None, 0.4) == 0.4 and utilization(None, None) == VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
