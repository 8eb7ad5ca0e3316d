"""Tests for dankserve.supervisor.worker.fleet: workers added, taken down, brought up and retired, and the views
status renders; in-process over the fake runtime (tests/supervisor/test_worker.py's world)."""

from __future__ import annotations

from pathlib import Path

from dankserve.supervisor.worker import DeploymentWorker
from tests.supervisor.test_worker import World, make_world, ready, wait_for


def new_worker(world: World) -> DeploymentWorker:
    return DeploymentWorker("chat", world.daemon.settings.deployments["chat"], world.daemon.worker_services())


def test_a_worker_added_unless_one_runs_leaves_the_running_one(tmp_path: Path) -> None:
    """The start-up loop's worker never replaces the one `up` started meanwhile (two would boot two servers)."""
    world = make_world(tmp_path)
    fleet = world.daemon.fleet
    first, second = new_worker(world), new_worker(world)
    fleet.add(first)
    try:
        fleet.add(second, unless_running=True)
        assert fleet.get("chat") is first and not second.alive
        wait_for(first, ready)
    finally:
        first.request_stop()
        assert first.join(10)


def test_down_up_and_retire_change_the_workers_and_the_views(tmp_path: Path) -> None:
    """down takes the worker out and remembers it; up starts a new one; a retired worker is reaped once ended."""
    world = make_world(tmp_path)
    fleet = world.daemon.fleet
    fleet.add(new_worker(world))
    taken = fleet.take_down("chat")
    assert taken is not None and fleet.get("chat") is None and fleet.state.is_down("chat")
    taken.request_stop()
    assert taken.join(10)
    assert [view.state for view in fleet.views()] == ["down"]
    fleet.bring_up("chat", lambda: new_worker(world))
    worker = fleet.get("chat")
    assert worker is not None and worker.alive and not fleet.state.is_down("chat")
    wait_for(worker, ready)
    assert fleet.views()[0].state == "ready" and fleet.serving_targets()[0].name == "chat"
    fleet.retire(worker)
    assert fleet.snapshot() == {}
    assert worker.join(10)
    fleet.reap()
    assert fleet.views()[0].state == "stopped"
