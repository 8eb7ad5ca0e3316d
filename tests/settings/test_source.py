"""Tests for dankserve.settings.source: the one holder of the running settings."""

from __future__ import annotations

from pathlib import Path

from dankserve.settings import DeploymentSettings, Settings, SettingsSource, as_source, reload_effects


def test_readers_see_an_accepted_reload_and_the_keys_it_keeps() -> None:
    """After accept, current() is the reload's settings and needs_restart names the kept keys."""
    running = Settings(hf_cache_dir=Path("/hf"))
    source = SettingsSource(running)
    loaded = running.model_copy(
        update={"podman_url": "unix:///elsewhere.sock", "deployments": {"a": DeploymentSettings(model="org/a")}}
    )
    source.accept(reload_effects(source.current(), loaded))
    assert set(source.current().deployments) == {"a"}
    assert source.current().podman_url == running.podman_url
    assert source.needs_restart() == ("podman_url",)


def test_as_source_keeps_a_source_and_wraps_fixed_settings() -> None:
    """A source passes through (readers share it); plain settings get a source of their own."""
    source = SettingsSource(Settings(hf_cache_dir=Path("/hf")))
    assert as_source(source) is source
    fixed = Settings(hf_cache_dir=Path("/other"))
    assert as_source(fixed).current() is fixed
