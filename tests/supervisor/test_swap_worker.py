"""In-process tests of a swap group member's worker: sleep, wake and their failures over the fake runtime."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dankserve.backend_address import BackendAddress
from dankserve.supervisor import machine as m
from dankserve.supervisor.worker import DeploymentWorker
from tests.supervisor.test_worker import World, make_world, ready, wait_for

SWAP = {"swap_group": "g", "gpu_memory_utilization": 0.9}
ASLEEP = m.FellAsleep(0.2)
AWAKE = m.WokeUp(0.3)


@pytest.fixture
def stopping() -> Iterator[list[DeploymentWorker]]:
    workers: list[DeploymentWorker] = []
    yield workers
    for worker in workers:
        worker.request_stop()
        worker.join(10)


def member(
    tmp_path: Path,
    stopping: list[DeploymentWorker],
    sleep: m.Event = ASLEEP,
    wake: m.Event = AWAKE,
) -> tuple[World, DeploymentWorker, list[tuple[str, str]]]:
    """A ready swap group member whose server's sleep and wake answer `sleep` and `wake`."""
    world = make_world(tmp_path, dep=SWAP)
    calls: list[tuple[str, str]] = []

    def sleep_server(address: BackendAddress, key: str | None, level: m.SleepLevel) -> m.Event:
        calls.append(("sleep", level))
        return sleep

    def wake_server(address: BackendAddress, key: str | None, level: m.SleepLevel) -> m.Event:
        calls.append(("wake", level))
        return wake

    servers = dataclasses.replace(world.daemon.world.servers, sleep_server=sleep_server, wake_server=wake_server)
    world.daemon.world = dataclasses.replace(world.daemon.world, servers=servers)
    worker = world.worker()
    stopping.append(worker)
    wait_for(worker, ready)
    return world, worker, calls


def test_a_member_sleeps_at_level_1_and_wakes_with_its_timings(
    tmp_path: Path, stopping: list[DeploymentWorker]
) -> None:
    """SleepRequested reaches /sleep at its level; WakeRequested wakes it; the timings are kept for status."""
    world, worker, calls = member(tmp_path, stopping)
    worker.feed(m.SleepRequested("1", "make room for b"))
    asleep = wait_for(worker, lambda s: s.stage is m.Stage.ASLEEP)
    assert asleep.status == "asleep" and asleep.swap.level == "1" and asleep.swap.last_sleep_seconds == 0.2
    assert asleep.workload_id is not None and not world.runtime.called("stop"), "level 1 keeps the server"
    worker.feed(m.WakeRequested())
    awake = wait_for(worker, ready)
    assert calls == [("sleep", "1"), ("wake", "1")]
    assert awake.swap.last_wake_seconds == 0.3 and awake.boots == 1
    swaps = world.daemon.telemetry.of("chat").swap_seconds  # what /metrics shows
    assert swaps["sleep"].total == 0.2 and swaps["wake"].total == 0.3 and swaps["wake"].count == 1


def test_a_server_without_sleep_mode_is_stopped_and_booted_to_wake(
    tmp_path: Path, stopping: list[DeploymentWorker]
) -> None:
    """/is_sleeping 404: the server is stopped and removed instead, and a wake boots it again (status: waking)."""
    world, worker, calls = member(tmp_path, stopping, sleep=m.SleepUnsupported("/is_sleeping 404"))
    first = worker.machine.workload_id
    worker.feed(m.SleepRequested("1"))
    asleep = wait_for(worker, lambda s: s.stage is m.Stage.ASLEEP)
    assert asleep.swap.level == "stop" and asleep.boot is None
    assert world.runtime.called("remove") == [first]
    worker.feed(m.WakeRequested())
    awake = wait_for(worker, lambda s: ready(s) and s.boots == 2)
    assert awake.swap.last_wake_seconds is not None and awake.swap.since is None
    assert calls == [("sleep", "1")], "the stop needs no sleep route"


@pytest.mark.parametrize("failing", ["sleep", "wake"])
def test_a_failed_sleep_or_wake_follows_the_failure_policy(
    tmp_path: Path, stopping: list[DeploymentWorker], failing: str
) -> None:
    """A sleep or wake that fails counts as the server failing: it is removed and restarted with backoff."""
    failed = m.SleepFailed("HTTP 500") if failing == "sleep" else m.WakeFailed("HTTP 500")
    _, worker, _ = member(
        tmp_path,
        stopping,
        **({"sleep": failed} if failing == "sleep" else {"wake": failed}),
    )
    worker.feed(m.SleepRequested("2"))
    if failing == "wake":
        wait_for(worker, lambda s: s.stage is m.Stage.ASLEEP)
        worker.feed(m.WakeRequested())
    again = wait_for(worker, lambda s: ready(s) and s.boots == 2)
    assert again.restarts == 1 and again.last_failure is not None
    assert again.last_failure.message == f"{failing} failed: HTTP 500"


@pytest.mark.parametrize("keep_launcher", [True, False])
def test_a_stop_while_waiting_for_gpu_room_keeps_the_launcher_only_for_down(
    tmp_path: Path, keep_launcher: bool
) -> None:
    """A member blocked before its boot (GPUs busy), then stopped: `down` keeps its launcher, SIGTERM removes it."""
    world = make_world(tmp_path, dep={**SWAP, "launcher": True})
    uuids = tuple(g.uuid for g in world.daemon.host.gpus)
    held = world.daemon.gpus.slots.acquire(uuids, threading.Event())
    assert held is not None
    try:
        worker = world.worker()
        wait_for(worker, lambda s: s.stage is m.Stage.WAITING_GPUS)
        worker.request_stop(keep_launcher=keep_launcher)
        assert worker.join(10)
    finally:
        held.release()
    assert worker.machine.stage is m.Stage.STOPPED
    assert len(world.runtime.called("find")) == (1 if keep_launcher else 2), "planning's look, and RemoveLauncher's"
