"""A reload is checked like a start (`Daemon.check_fit`): in-process, over the fake runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dankserve.testing.config_file import write_config
from tests.supervisor.test_worker import make_world, ready, wait_for, world_deployment, world_globals


def _deployment(port: int, **extra: Any) -> dict[str, Any]:
    return world_deployment(port, gpus=[0], gpu_memory_utilization=0.5, **extra)


def _reload(daemon: Any, tmp_path: Path, deployments: dict[str, dict[str, Any]]) -> None:
    write_config(daemon.world.config_path, world_globals(tmp_path), deployments)
    daemon._apply_reload()


def test_a_reload_that_would_over_commit_a_gpu_is_refused_and_the_running_configuration_kept(
    tmp_path: Path,
) -> None:
    """Two members leaving their swap group would need 1.0 of one GPU: the reload is refused (config_refusal names
    the GPU and the fix), nothing is started or stopped; put back in a group, the same pair is accepted."""
    world = make_world(tmp_path, dep={"gpus": [0], "gpu_memory_utilization": 0.5, "swap_group": "g"})
    daemon = world.daemon
    daemon._start_worker("chat", daemon.settings.deployments["chat"])
    wait_for(daemon.fleet.snapshot()["chat"], ready)
    before = daemon.settings

    _reload(daemon, tmp_path, {"chat": _deployment(18000), "code": _deployment(18001)})
    assert daemon.settings is before and set(daemon.fleet.snapshot()) == {"chat"}
    assert daemon.config_refusal is not None
    error = daemon.config_refusal.error
    assert "0.95" in error and "chat" in error and "code" in error, error

    _reload(
        daemon, tmp_path, {name: _deployment(port, swap_group="g") for name, port in (("chat", 18000), ("code", 18001))}
    )
    assert daemon.config_refusal is None and set(daemon.settings.deployments) == {"chat", "code"}
    daemon._stop_all()
