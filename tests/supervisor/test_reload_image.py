"""The image an upgrade switched a deployment to is a runtime fact of state.json (issue 40 item 4): the worker
plans it, status shows it, a reload of the same file keeps it, and a file naming another image wins over
it and says so. In process, over a fake runtime (test_worker's world); the real upgrade and reload are
test_upgrade_podman.py's."""

from __future__ import annotations

from pathlib import Path

from dankserve.state import UpgradeRecord
from dankserve.testing.config_file import write_config
from tests.supervisor.test_worker import make_world, ready, wait_for, world_deployment, world_globals

CONFIGURED = "vllm/vllm-openai:v0.33.0"
UPGRADED = "vllm/vllm-openai:v0.34.0"


def test_the_upgraded_image_comes_from_state_survives_a_reload_and_yields_to_a_new_config_image(
    tmp_path: Path,
) -> None:
    world = make_world(tmp_path)
    daemon = world.daemon
    daemon.state.set_upgrade("chat", UpgradeRecord("switched", CONFIGURED, UPGRADED, 0.0))
    worker = world.worker()
    try:
        wait_for(worker, ready)
        assert world.runtime.specs[-1].image == UPGRADED, "the worker plans the image state.json keeps"
        assert daemon.settings.deployments["chat"].image == CONFIGURED, "the settings stay the file's"
        assert daemon.fleet.view("chat", worker).image == UPGRADED, "status shows what runs"

        kept = daemon._apply_reload()  # the same file: the upgraded server keeps running
        assert kept.accepted and kept.keep == ("chat",) and kept.restart == (), kept
        assert len(world.runtime.specs) == 1

        third = "vllm/vllm-openai:v0.33.1"
        globals_ = {**world_globals(tmp_path), "health_interval_seconds": 1.0, "gpu_memory_settle_seconds": 2.0}
        config = daemon.world.config_path
        assert config is not None
        write_config(config, globals_, {"chat": world_deployment(18000, image=third)})
        moved = daemon._apply_reload()
        assert moved.accepted and moved.restart == ("chat",), moved
        wait_for(worker, lambda s: ready(s) and s.boots == 2)
        assert world.runtime.specs[-1].image == third, "the file's new image wins over the upgrade"
        record = daemon.state.deployment("chat").upgrade
        assert record is not None and record.step == "rolled_back" and third in (record.reason or "")
    finally:
        worker.request_stop()
        worker.join(10)


def test_status_without_a_daemon_shows_the_image_an_upgrade_switched_to(tmp_path: Path) -> None:
    """`dankserve status` while no daemon runs reads the image from state.json too, not from the settings."""
    from dankserve.cli.status import offline_status
    from dankserve.settings import Settings
    from dankserve.supervisor.records import StateBook

    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    StateBook(state_dir).set_upgrade("chat", UpgradeRecord("switched", CONFIGURED, UPGRADED, 0.0))
    chat = {"model": "org/m", "image": CONFIGURED, "port": 18001, "enabled": False}
    settings = Settings.model_validate({"state_dir": str(state_dir), "deployments": {"chat": chat}})
    (shown,) = offline_status(settings)["deployments"]
    assert shown["image"] == UPGRADED
