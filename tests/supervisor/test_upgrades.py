"""The image a deployment runs after an upgrade: the new one once switched away from the configured one."""

from __future__ import annotations

from dankserve.settings import Settings
from dankserve.state import UpgradeRecord
from dankserve.supervisor.upgrades import serving_image, with_serving_images


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


def test_the_settings_carry_the_switched_image_and_only_that_change() -> None:
    """Only the switched deployment's image changes; unchanged settings are the same object."""
    settings = Settings.model_validate(
        {"deployments": {"a": {"model": "m", "image": "img:old", "port": 8001}, "b": {"model": "m", "port": 8002}}}
    )
    changed = with_serving_images(settings, {"a": record("switched"), "b": None})
    assert changed.deployments["a"].image == "img:new"
    assert changed.deployments["b"] == settings.deployments["b"]
    assert with_serving_images(settings, {}) is settings
