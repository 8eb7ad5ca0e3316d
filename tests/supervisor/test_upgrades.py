"""The image a deployment runs after an upgrade: the new one once switched away from the configured one."""

from __future__ import annotations

from pathlib import Path

from dankserve.settings import Settings
from dankserve.settings.source import SettingsSource
from dankserve.state import UpgradeRecord
from dankserve.supervisor.records import StateBook, serving_image
from dankserve.supervisor.upgrade.manager import Upgrades


def record(step: str, old: str = "img:old", new: str = "img:new") -> UpgradeRecord:
    return UpgradeRecord(step, old, new, 0.0)


def test_a_switched_upgrade_runs_the_new_image() -> None:
    """Switched from the configured image: the new one."""
    assert serving_image("img:old", record("switched")) == "img:new"


def test_anything_but_a_switch_runs_the_configured_image() -> None:
    """Rolled back, refused, under way or none: the configured image."""
    for step in ("rolled_back", "refused", "booting", "switching"):
        assert serving_image("img:old", record(step)) == "img:old"
    assert serving_image("img:old", None) == "img:old"


def test_a_configuration_naming_another_image_wins() -> None:
    """The config changed to a third image after the switch: that one runs."""
    assert serving_image("img:third", record("switched")) == "img:third"


def test_a_deployment_runs_the_image_state_keeps_and_the_settings_stay_the_configs(tmp_path: Path) -> None:
    """The switched image is read from state (`StateBook.as_run`); an unswitched deployment is the same object."""
    settings = Settings.model_validate(
        {"deployments": {"a": {"model": "m", "image": "img:old", "port": 8001}, "b": {"model": "m", "port": 8002}}}
    )
    state = StateBook(tmp_path, persist=False)
    state.set_upgrade("a", record("switched"))
    assert state.as_run("a", settings.deployments["a"]).image == "img:new"
    assert settings.deployments["a"].image == "img:old"
    assert state.as_run("b", settings.deployments["b"]) is settings.deployments["b"]


class _Fleet:
    def snapshot(self) -> dict[str, object]:
        return {}


class _Daemon:
    """Only what `Upgrades.rollback` reads: settings, the state book, the fleet."""

    def __init__(self, tmp_path: Path, upgrade: UpgradeRecord | None) -> None:
        settings = Settings.model_validate({"deployments": {"a": {"model": "m", "image": "img:old", "port": 8001}}})
        self.source = SettingsSource(settings)
        self.state = StateBook(tmp_path, persist=False)
        if upgrade is not None:
            self.state.set_upgrade("a", upgrade)
        self.fleet = _Fleet()

    @property
    def settings(self) -> Settings:
        return self.source.current()


def _rollback(tmp_path: Path, upgrade: UpgradeRecord | None) -> tuple[str | None, _Daemon]:
    daemon = _Daemon(tmp_path, upgrade)
    return Upgrades(daemon).rollback("a"), daemon  # type: ignore[arg-type]


def test_rollback_refuses_without_a_switched_upgrade(tmp_path: Path) -> None:
    """No upgrade, or one rolled back already: said, nothing changes."""
    assert "no switched upgrade" in (_rollback(tmp_path, None)[0] or "")
    assert "no switched upgrade" in (_rollback(tmp_path, record("rolled_back"))[0] or "")


def test_rollback_refuses_a_moving_tag_it_cannot_go_back_through(tmp_path: Path) -> None:
    """The same reference before and after (auto-update of a moving tag): the fix names pinning the release."""
    error, _ = _rollback(tmp_path, record("switched", "img:latest", "img:latest"))
    assert error is not None and "moving tag" in error and "digest" in error


def test_rollback_records_it_and_runs_the_old_image(tmp_path: Path) -> None:
    """A switched upgrade: recorded rolled back, the deployment runs the configured (old) image again."""
    error, daemon = _rollback(tmp_path, record("switched"))
    assert error is None
    assert daemon.state.deployment("a").upgrade is not None
    assert daemon.state.deployment("a").upgrade.step == "rolled_back"  # type: ignore[union-attr]
    assert daemon.state.as_run("a", daemon.settings.deployments["a"]).image == "img:old"
