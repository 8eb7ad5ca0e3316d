"""Tests for dankserve.supervisor.fleet.swap_groups: the coordinator's choices over members' machine states.

The daemon is a small stand-in at the coordinator's seam (settings, the workers' machines and
inboxes); the real daemon and Podman are tested in test_swap_podman.py.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from dankserve.settings import GatewaySettings, Settings
from dankserve.state import DeploymentState, UnsafeSleep
from dankserve.supervisor import machine as m
from dankserve.supervisor.fleet.swap_groups import PlanFacts, SwapGroups
from dankserve.supervisor.policy import RestartSettings
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


def world(members: dict[str, tuple[m.Stage, float, dict[str, Any]]]) -> tuple[SwapGroups, Daemon]:
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
    groups = SwapGroups(daemon, lambda: 64 << 30)  # type: ignore[arg-type]
    for name, (_, util, _) in members.items():
        groups.record_plan(name, PlanFacts(util, 2 << 30, sleep_mode=True))
        groups._booted.add(name)  # start-up is over
    return groups, daemon


def test_a_wake_puts_the_least_recently_used_unpinned_member_to_sleep_first() -> None:
    """Room for c: b (unpinned) sleeps, never the pinned a; c wakes once b is asleep."""
    groups, daemon = world(
        {
            "a": (m.Stage.READY, 0.5, {"pinned": True}),
            "b": (m.Stage.READY, 0.4, {}),
            "c": (m.Stage.ASLEEP, 0.4, {}),
        }
    )
    groups.touched("b")
    groups.released("b")
    groups.wake("c")
    groups._look()
    assert daemon.workers["a"].fed == []
    assert [type(e) for e in daemon.workers["b"].fed] == [m.SleepRequested]
    assert daemon.workers["c"].fed == [], "c waits until b is asleep"
    b = daemon.workers["b"]
    b.machine = m.MachineState(CONFIG, stage=m.Stage.ASLEEP, gpu_uuids=("GPU-0",), swap=m.SwapTimes(level="1"))
    groups._look()
    assert daemon.workers["c"].fed == [m.WakeRequested()]


def test_a_member_busy_with_a_request_is_not_put_to_sleep() -> None:
    """A request in flight on the only member that could make room: the wake waits."""
    groups, daemon = world({"a": (m.Stage.READY, 0.9, {}), "b": (m.Stage.ASLEEP, 0.9, {})})
    groups.touched("a")  # in flight
    groups.wake("b")
    groups._look()
    assert daemon.workers["a"].fed == [] and daemon.workers["b"].fed == []
    groups.released("a")
    groups._look()
    assert [type(e) for e in daemon.workers["a"].fed] == [m.SleepRequested]


def test_a_wake_that_cannot_fit_beside_pinned_members_is_refused_with_the_reason() -> None:
    """A pinned member at 0.9 leaves no room for another at 0.9: the wake is refused (the gateway's 503)."""
    groups, daemon = world({"a": (m.Stage.READY, 0.9, {"pinned": True}), "b": (m.Stage.ASLEEP, 0.9, {})})
    groups.wake("b")
    groups._look()
    reason = groups.refused("b")
    assert reason is not None and "pinned a" in reason
    assert daemon.workers["a"].fed == [] and daemon.workers["b"].fed == []


def test_idle_members_are_put_to_sleep_and_pinned_ones_never() -> None:
    """idle_sleep_seconds passed without requests: asleep; the level follows RAM and the weights."""
    groups, daemon = world({"a": (m.Stage.READY, 0.4, {"idle_sleep_seconds": 0.01}), "b": (m.Stage.READY, 0.4, {})})
    groups.touched("a")
    groups.released("a")
    time.sleep(0.05)
    groups._look()
    fed = daemon.workers["a"].fed
    assert len(fed) == 1 and isinstance(fed[0], m.SleepRequested) and fed[0].level == "1"
    assert daemon.workers["b"].fed == []


def test_first_boots_come_one_at_a_time_and_the_groups_first_member_last() -> None:
    """At start-up b boots before a (the group's first), and c waits while b boots."""
    groups, _ = world(
        {"a": (m.Stage.WAITING_GPUS, 0.9, {}), "b": (m.Stage.WAITING_GPUS, 0.9, {}), "c": (m.Stage.IDLE, 0.9, {})}
    )
    groups._booted.clear()
    cancelled = threading.Event()
    assert groups.admit_boot("b", ("GPU-0",), cancelled)
    assert groups._boot_waits_for("c", "g") is not None, "b's first boot is under way"
    assert groups._boot_waits_for("a", "g") is not None, "the group's first boots last"


def test_a_member_put_to_sleep_before_it_was_seen_ready_has_had_its_first_boot() -> None:
    """Another's boot may put a member to sleep right after its ready: asleep counts as booted once."""
    groups, _ = world({"a": (m.Stage.WAITING_GPUS, 0.9, {}), "b": (m.Stage.ASLEEP, 0.9, {})})
    groups._booted.clear()
    assert groups._boot_waits_for("a", "g") is not None
    groups._look()
    assert groups._boot_waits_for("a", "g") is None


def test_a_server_adopted_awake_after_a_daemon_kill_stays_awake() -> None:
    """After kill -9 of the daemon, b (not the group's first) adopted ready stays awake; a fresh first boot sleeps."""
    groups, daemon = world({"a": (m.Stage.ASLEEP, 0.9, {}), "b": (m.Stage.READY, 0.9, {})})
    groups._booted.clear()
    adopted = m.Boot(started_at=0.0, workload_id="w-b", adopted=True)
    daemon.workers["b"].machine = replace(daemon.workers["b"].machine, boot=adopted)
    groups._look()
    assert daemon.workers["b"].fed == []
    groups._booted.clear()
    daemon.workers["b"].machine = replace(daemon.workers["b"].machine, boot=replace(adopted, adopted=False))
    groups._look()
    assert [type(e) for e in daemon.workers["b"].fed] == [m.SleepRequested]


def test_a_member_that_joined_asleep_is_booted_on_its_wake_and_its_boot_makes_room() -> None:
    """c, added by a reload asleep by stop: nothing moves until a wake; then it boots (no sleep asked first:
    its boot's admission puts a to sleep), and its boot counts as a first boot already had."""
    groups, daemon = world({"a": (m.Stage.READY, 0.9, {}), "c": (m.Stage.ASLEEP, 0.9, {})})
    groups._booted.discard("c")
    c = daemon.workers["c"]
    c.machine = replace(c.machine, swap=m.SwapTimes(level="stop"))
    groups._look()
    assert daemon.workers["a"].fed == [] and c.fed == [] and "c" in groups._booted
    groups.wake("c")
    groups._look()
    assert c.fed == [m.WakeRequested()] and daemon.workers["a"].fed == []
    c.machine = replace(c.machine, stage=m.Stage.PULLING)
    admitted = threading.Thread(target=groups.admit_boot, args=("c", ("GPU-0",), threading.Event()), daemon=True)
    admitted.start()
    admitted.join(0.5)
    a = daemon.workers["a"]
    a.machine = replace(a.machine, stage=m.Stage.ASLEEP)  # (this stand-in worker does not step: asked again)
    assert a.fed and {type(e) for e in a.fed} == {m.SleepRequested}
    groups.poke()
    admitted.join(5)
    assert not admitted.is_alive()


def test_an_awake_member_busy_when_a_wake_comes_drains_until_its_requests_end() -> None:
    """Its requests in flight finish (it is not put to sleep meanwhile); it counts as draining for the wake,
    so the gateway holds requests for it that arrive later; once idle it sleeps and no longer drains."""
    groups, daemon = world({"a": (m.Stage.READY, 0.9, {}), "b": (m.Stage.ASLEEP, 0.9, {})})
    groups.touched("a")
    groups.wake("b")
    groups._look()
    assert groups.draining("a") == "b" and daemon.workers["a"].fed == []
    groups.released("a")
    groups._look()
    assert [type(e) for e in daemon.workers["a"].fed] == [m.SleepRequested]
    assert groups.draining("a") is None


def test_the_swap_bound_holds_a_wake_until_the_group_may_swap_again() -> None:
    """max_swaps_per_minute = 1: the first swap begins; a swap back within the minute is held (nothing sleeps,
    the awake member keeps serving and does not drain) and the time to wait is told."""
    groups, daemon = world({"a": (m.Stage.READY, 0.9, {}), "b": (m.Stage.ASLEEP, 0.9, {})})
    daemon.settings = daemon.settings.model_copy(update={"gateway": GatewaySettings(max_swaps_per_minute=1)})
    groups.wake("b")
    groups._look()
    assert [type(e) for e in daemon.workers["a"].fed] == [m.SleepRequested] and groups.held_for("b") is None
    asleep = m.MachineState(CONFIG, stage=m.Stage.ASLEEP, gpu_uuids=("GPU-0",), swap=m.SwapTimes(level="1"))
    daemon.workers["a"].machine = asleep
    groups._look()
    assert daemon.workers["b"].fed == [m.WakeRequested()]
    daemon.workers["b"].machine = m.MachineState(CONFIG, stage=m.Stage.READY, gpu_uuids=("GPU-0",))
    groups.touched("b")
    groups.wake("a")
    groups._look()
    held = groups.held_for("a")
    assert held is not None and 50 < held <= 60
    assert daemon.workers["b"].fed == [m.WakeRequested()] and groups.draining("b") is None


def test_a_boot_waiting_for_a_busy_member_drains_it_too() -> None:
    """A wake by booting (or a restart) waits in admit_boot for the busy awake member, which drains meanwhile."""
    groups, daemon = world({"a": (m.Stage.READY, 0.9, {}), "b": (m.Stage.ASLEEP, 0.9, {})})
    groups.touched("a")
    cancelled = threading.Event()
    admitted: list[bool] = []
    boot = threading.Thread(target=lambda: admitted.append(groups.admit_boot("b", ("GPU-0",), cancelled)))
    boot.start()
    wait_until(lambda: groups.draining("a") is not None, 10, 0.01, what="a to drain")
    assert groups.draining("a") == "b" and daemon.workers["a"].fed == []
    cancelled.set()
    boot.join(10)
    assert admitted == [False] and groups.draining("a") is None


@pytest.mark.parametrize(
    ("unsafe", "level"),
    [((), "1"), (("1",), "2"), (("1", "2"), "stop"), (("2",), "1")],
)
def test_a_member_sleeps_the_next_safe_way_when_its_level_is_marked_unsafe(unsafe: tuple[str, ...], level: str) -> None:
    """Levels the state file marks unsafe for the member's vLLM and model are skipped: 1, then 2, then stop."""
    groups, daemon = world({"a": (m.Stage.READY, 0.5, {}), "b": (m.Stage.READY, 0.4, {})})
    records = tuple(UnsafeSleep(u, None, "m", "kept its memory", 0.0) for u in unsafe)
    daemon.state.records["a"] = DeploymentState(unsafe_sleep=records)
    assert groups.sleep("a", "by hand") is None
    (event,) = daemon.workers["a"].fed
    assert isinstance(event, m.SleepRequested) and event.level == level


def test_a_level_unsafe_for_another_model_or_release_is_still_used() -> None:
    """An unsafe mark holds for its vLLM version and model only."""
    groups, daemon = world({"a": (m.Stage.READY, 0.5, {})})
    daemon.state.records["a"] = DeploymentState(unsafe_sleep=(UnsafeSleep("1", "0.26.0", "test/a", "x", 0.0),))
    assert groups.sleep("a", "by hand") is None
    (event,) = daemon.workers["a"].fed
    assert isinstance(event, m.SleepRequested) and event.level == "1"
