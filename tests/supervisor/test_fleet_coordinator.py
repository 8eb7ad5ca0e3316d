"""Tests for dankserve.supervisor.fleet.coordinator: the thread that executes the pure `coordinate`'s directives
on the injected clock (its decisions are tested in test_fleet_coordinate.py).

The daemon is a small stand-in at the coordinator's seam (settings, the workers' machines and
inboxes); the real daemon and Podman are tested in test_swap_podman.py.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from dankserve.settings import Settings
from dankserve.state import DeploymentState, UnsafeSleep
from dankserve.supervisor import machine as m
from dankserve.supervisor.fleet import coordinate as c
from dankserve.supervisor.fleet.coordinator import FleetCoordinator, PlanFacts
from dankserve.supervisor.policy import RestartSettings
from dankserve.testing.lifecycle import FakeClock
from tests.harness.wait import wait_until

CONFIG = m.MachineConfig(RestartSettings(1, 1, 1, 0, 1, 1))


@dataclass
class Worker:
    name: str
    machine: m.MachineState
    fed: list[m.Event] = field(default_factory=list)

    def feed(self, event: m.Event) -> None:
        self.fed.append(event)


@dataclass
class State:
    records: dict[str, DeploymentState] = field(default_factory=dict)

    def is_down(self, name: str) -> bool:
        return False

    def deployment(self, name: str) -> DeploymentState:
        return self.records.get(name) or DeploymentState()


@dataclass
class Daemon:
    settings: Settings
    workers: dict[str, Worker]
    state: State = field(default_factory=State)

    def snapshot(self) -> dict[str, Any]:
        return dict(self.workers)


def world(members: dict[str, tuple[m.Stage, float, dict[str, Any]]]) -> tuple[FleetCoordinator, Daemon]:
    """A group g on one GPU: name -> (stage, utilisation, more settings)."""
    deployments = {
        name: {"model": "m", "port": 8001 + i, "swap_group": "g", "gpu_memory_utilization": util, **extra}
        for i, (name, (_, util, extra)) in enumerate(members.items())
    }
    settings = Settings(state_dir="/nonexistent", deployments=deployments)
    workers = {}
    for name, (stage, _, _) in members.items():
        swap = m.SwapTimes(level="1") if stage is m.Stage.ASLEEP else m.SwapTimes()
        state = m.MachineState(CONFIG, stage=stage, gpu_uuids=("GPU-0",), swap=swap)
        workers[name] = Worker(name, state)
    daemon = Daemon(settings, workers)
    groups = FleetCoordinator(daemon, lambda: 64 << 30, FakeClock())  # type: ignore[arg-type]
    for name, (_, util, _) in members.items():
        groups.record_plan(name, PlanFacts(util, 2 << 30, sleep_mode=True))
    groups.apply(c.Look())  # start-up is over (each member's first boot is)
    for worker in workers.values():
        worker.fed.clear()  # (the first boots' sleeps)
    return groups, daemon


@pytest.fixture
def running() -> Any:
    """Coordinators started in the test, closed after it."""
    started: list[FleetCoordinator] = []
    yield started
    for coordinator in started:
        coordinator.close()


def test_the_thread_executes_wakes_and_sleeps_and_answers_a_waiting_boot(running: list[FleetCoordinator]) -> None:
    """The gateway's wake of b: a (idle) is fed SleepRequested at the level RAM allows; once a is asleep b is fed
    WakeRequested. A boot asking for room meanwhile is told why it waits, then admitted."""
    groups, daemon = world({"a": (m.Stage.READY, 0.9, {}), "b": (m.Stage.ASLEEP, 0.9, {})})
    groups.start()
    running.append(groups)
    groups.wake("b")
    a, b = daemon.workers["a"], daemon.workers["b"]
    wait_until(lambda: bool(a.fed), 10, 0.01, what="a put to sleep")
    assert isinstance(a.fed[0], m.SleepRequested) and a.fed[0].level == "1"
    a.machine = m.MachineState(CONFIG, stage=m.Stage.ASLEEP, gpu_uuids=("GPU-0",), swap=m.SwapTimes(level="1"))
    groups.poke()
    wait_until(lambda: b.fed == [m.WakeRequested()], 10, 0.01, what="b woken")


def test_a_boot_waits_for_room_without_holding_anything_and_is_admitted_once_there_is(
    running: list[FleetCoordinator],
) -> None:
    """b's boot (a restart) asks for room while a is busy: told why, a drains; a sleeps once idle, then b is
    admitted."""
    groups, daemon = world({"a": (m.Stage.READY, 0.9, {}), "b": (m.Stage.DECIDING, 0.9, {})})
    groups.start()
    running.append(groups)
    groups.touched("a")
    told: list[str] = []
    admitted: list[bool] = []
    boot = threading.Thread(
        target=lambda: admitted.append(groups.admit_boot("b", ("GPU-0",), threading.Event(), told.append))
    )
    boot.start()
    wait_until(lambda: groups.draining("a") == "b" and bool(told), 10, 0.01, what="a to drain")
    assert daemon.workers["a"].fed == [] and "waits for a" in told[-1]
    groups.released("a")
    groups.poke()
    wait_until(lambda: bool(daemon.workers["a"].fed), 10, 0.01, what="a put to sleep")
    daemon.workers["a"].machine = m.MachineState(CONFIG, stage=m.Stage.ASLEEP, gpu_uuids=("GPU-0",))
    groups.poke()
    boot.join(10)
    assert admitted == [True]


def test_a_boot_waiting_for_a_busy_member_is_cancelled_when_its_worker_stops(running: list[FleetCoordinator]) -> None:
    """A wake by booting (or a restart) waits for the busy awake member, which drains meanwhile; stopping the
    worker ends the wait (False) and the drain."""
    groups, daemon = world({"a": (m.Stage.READY, 0.9, {}), "b": (m.Stage.ASLEEP, 0.9, {})})
    groups.start()
    running.append(groups)
    groups.touched("a")
    cancelled = threading.Event()
    admitted: list[bool] = []
    boot = threading.Thread(target=lambda: admitted.append(groups.admit_boot("b", ("GPU-0",), cancelled)))
    boot.start()
    wait_until(lambda: groups.draining("a") is not None, 10, 0.01, what="a to drain")
    assert groups.draining("a") == "b" and daemon.workers["a"].fed == []
    cancelled.set()
    boot.join(10)
    wait_until(lambda: groups.draining("a") is None, 10, 0.01, what="the drain to end")
    assert admitted == [False]


def test_idle_sleep_counts_down_on_the_injected_clock() -> None:
    """`status`'s idle countdown and the idle sleep read the daemon's clock, not the host's."""
    groups, daemon = world({"a": (m.Stage.READY, 0.4, {"idle_sleep_seconds": 30}), "b": (m.Stage.READY, 0.4, {})})
    clock = groups._clock
    assert isinstance(clock, FakeClock)
    groups.touched("a")
    groups.released("a")
    assert groups.idle_sleep_in("a") == 30.0
    clock.advance(29)
    groups.apply(c.Look())
    assert daemon.workers["a"].fed == [] and groups.idle_sleep_in("a") == 1.0
    clock.advance(1)
    groups.apply(c.Look())
    (fed,) = daemon.workers["a"].fed
    assert isinstance(fed, m.SleepRequested) and daemon.workers["b"].fed == []


@pytest.mark.parametrize(
    ("unsafe", "level"),
    [((), "1"), (("1",), "2"), (("1", "2"), "stop"), (("2",), "1")],
)
def test_a_member_sleeps_the_next_safe_way_when_its_level_is_marked_unsafe(unsafe: tuple[str, ...], level: str) -> None:
    """Levels the state file marks unsafe for the member's vLLM and model are skipped: 1, then 2, then stop."""
    groups, daemon = world({"a": (m.Stage.READY, 0.5, {}), "b": (m.Stage.READY, 0.4, {})})
    records = tuple(UnsafeSleep(u, None, "m", "kept its memory", 0.0) for u in unsafe)
    daemon.state.records["a"] = DeploymentState(unsafe_sleep=records)
    assert groups.sleep("a", "by hand") is None  # (decided at once: the coordinator's thread is not started)
    (event,) = daemon.workers["a"].fed
    assert isinstance(event, m.SleepRequested) and event.level == level


def test_a_level_unsafe_for_another_model_or_release_is_still_used() -> None:
    """An unsafe mark holds for its vLLM version and model only."""
    groups, daemon = world({"a": (m.Stage.READY, 0.5, {})})
    daemon.state.records["a"] = DeploymentState(unsafe_sleep=(UnsafeSleep("1", "0.26.0", "test/a", "x", 0.0),))
    assert groups.sleep("a", "by hand") is None  # (decided at once: the coordinator's thread is not started)
    (event,) = daemon.workers["a"].fed
    assert isinstance(event, m.SleepRequested) and event.level == "1"
