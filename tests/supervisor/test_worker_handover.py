"""In-process tests of a worker adopting a workload handed over to it (an upgrade's trial server, issue 40 item 3):
the lifecycle's adoption path, over the fake runtime; the real daemon and Podman are in test_upgrade_podman.py."""

from __future__ import annotations

from pathlib import Path

from dankserve.runtime.base import LABEL_FINGERPRINT
from dankserve.supervisor import machine as m
from dankserve.supervisor.worker import DeploymentWorker
from tests.supervisor.test_worker import make_world, ready, stopping, wait_for

__all__ = ["stopping"]  # the fixture


def test_a_workload_handed_over_is_adopted_with_no_second_boot(
    tmp_path: Path, stopping: list[DeploymentWorker]
) -> None:
    """The trial (same plan) is renamed to the deployment's, adopted through the lifecycle's adoption and ready;
    the old workload stopped and removed; nothing started, the boot count unchanged."""
    world = make_world(tmp_path)
    worker = world.worker()
    stopping.append(worker)
    first = wait_for(worker, ready)
    fingerprint = world.runtime.specs[0].labels[LABEL_FINGERPRINT]
    trial = world.runtime.run_existing("chat.upgrade", fingerprint)
    worker.request_replan(world.daemon.settings.deployments["chat"], handover=trial)
    adopted = wait_for(worker, lambda s: ready(s) and s.workload_id == trial)
    assert adopted.boot is not None and adopted.boot.adopted
    assert world.runtime.called("start") == ["chat"] and world.runtime.called("rename") == [f"{trial} chat"]
    assert first.workload_id in world.runtime.called("remove")
    assert adopted.boots == first.boots


def test_a_workload_handed_over_with_another_plan_is_replaced(tmp_path: Path, stopping: list[DeploymentWorker]) -> None:
    """A handed-over workload the plan does not match is not adopted: the machine replaces it (one boot)."""
    world = make_world(tmp_path)
    worker = world.worker()
    stopping.append(worker)
    wait_for(worker, ready)
    trial = world.runtime.run_existing("chat.upgrade", "another-plan")
    worker.request_replan(world.daemon.settings.deployments["chat"], handover=trial)
    after = wait_for(worker, lambda s: ready(s) and s.workload_id not in (None, trial) and s.boots == 2)
    assert trial in world.runtime.called("remove") and after.stage is m.Stage.READY
