"""Tests for dankserve.settings.reloading: what a reload does with each global key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dankserve.errors import ConfigError
from dankserve.settings import (
    ON_RELOAD,
    ClusterSettings,
    DeploymentSettings,
    GatewaySettings,
    Settings,
    global_keys,
    load_reload,
    reload_effects,
)
from dankserve.settings.upgrade import UpgradeSettings
from dankserve.testing.config_file import write_config

GLOBAL_KEYS = [name for name in Settings.model_fields if name != "deployments"]

OTHER_VALUE: dict[str, Any] = {
    "podman_url": "unix:///run/user/1000/podman/podman.sock",
    "state_dir": Path("/srv/dankserve/state"),
    "cache_dir": Path("/srv/dankserve/cache"),
    "hf_cache_dir": Path("/srv/dankserve/hf"),
    "snapshot_max_bytes": 2**30,
    "vllm_version": "0.30.0",
    "upgrade": UpgradeSettings(auto_update="registry", kv_shrink_percent=2.0),
    "restart_backoff_initial_seconds": 7.0,
    "restart_backoff_max_seconds": 70.0,
    "restart_backoff_multiplier": 3.0,
    "restart_jitter_seconds": 4.0,
    "failure_window_seconds": 100.0,
    "max_failures_in_window": 9,
    "boot_timeout_seconds": 99.0,
    "stop_timeout_seconds": 5.0,
    "gpu_memory_settle_seconds": 3.0,
    "health_interval_seconds": 9.0,
    "gateway": GatewaySettings(listen="127.0.0.1:8100"),
    "metrics_listen": "127.0.0.1:9400",
    "metrics_api_key_file": Path("/etc/dankserve/metrics.key"),
    "serving_scrape_interval_seconds": 11.0,
    "stall_seconds": 12.0,
    "liveness_interval_seconds": 13.0,
    "liveness_timeout_seconds": 14.0,
    "preemption_warning_interval_seconds": 15.0,
    "log_format": "json",
    "cluster": ClusterSettings(
        listen="10.0.0.1:7390",
        token_file=Path("/etc/dankserve/token"),
        tls_ca_file=Path("/etc/dankserve/ca.pem"),
        tls_cert_file=Path("/etc/dankserve/cert.pem"),
        tls_key_file=Path("/etc/dankserve/key.pem"),
    ),
}
"""A valid value other than the default for each global key (a new key needs one here too)."""

RUNNING = Settings(hf_cache_dir=Path("/var/cache/dankserve/huggingface"))


def loaded_with(key: str) -> Settings:
    """The running settings with one global key changed and one deployment added, as a file would say."""
    deployments = {"chat": DeploymentSettings(model="org/chat")}
    return RUNNING.model_copy(update={key: OTHER_VALUE[key], "deployments": deployments})


def test_every_global_key_is_classified() -> None:
    """The table names exactly the settings model's global keys, each with how or why."""
    assert set(ON_RELOAD) == set(global_keys()) == set(GLOBAL_KEYS)
    assert all(rule.how for rule in ON_RELOAD.values())


@pytest.mark.parametrize("key", GLOBAL_KEYS)
def test_each_global_key_is_applied_or_kept_with_the_new_deployments(key: str) -> None:
    """A changed key is either run with at once (named applied) or kept at its running value (named as waiting
    for a restart); the file's deployments are taken either way."""
    assert key in ON_RELOAD, f"{key}: say in dankserve.settings.reloading.ON_RELOAD what a reload does with it"
    loaded = loaded_with(key)
    assert getattr(loaded, key) != getattr(RUNNING, key)
    effects = reload_effects(RUNNING, loaded)
    assert set(effects.settings.deployments) == {"chat"}
    if ON_RELOAD[key].applied:
        assert (effects.applied, effects.needs_restart) == ((key,), ())
        assert getattr(effects.settings, key) == OTHER_VALUE[key]
    else:
        assert (effects.applied, effects.needs_restart) == ((), (key,))
        assert getattr(effects.settings, key) == getattr(RUNNING, key)


@pytest.mark.parametrize("key", [k for k in GLOBAL_KEYS if not ON_RELOAD[k].applied])
def test_a_key_waiting_for_a_restart_stops_waiting_once_the_file_says_the_running_value_again(key: str) -> None:
    """The kept key is named at every reload while the file differs, and no more once it says the running value."""
    first = reload_effects(RUNNING, loaded_with(key))
    again = reload_effects(first.settings, loaded_with(key))
    assert again.needs_restart == (key,)
    back = reload_effects(again.settings, RUNNING)
    assert back.needs_restart == () and back.settings == RUNNING


def test_an_unchanged_file_changes_nothing() -> None:
    """The same settings again: nothing applied, nothing waiting, the same settings run."""
    effects = reload_effects(RUNNING, RUNNING)
    assert (effects.settings, effects.applied, effects.needs_restart) == (RUNNING, (), ())


def test_a_reload_whose_deployments_do_not_fit_the_kept_gateway_is_refused(tmp_path: Path) -> None:
    """The file moves the gateway (kept until a restart) and gives a deployment the port it still listens on:
    a ConfigError naming the kept key and the restart, not a daemon routing to a clash."""
    running = Settings(gateway=GatewaySettings(listen="127.0.0.1:8100"), hf_cache_dir=tmp_path / "hf")
    config = write_config(
        tmp_path / "dankserve.toml",
        {"hf_cache_dir": str(tmp_path / "hf"), "gateway": {"listen": "127.0.0.1:8200"}},
        {"chat": {"model": "org/chat", "port": 8100, "listen": "tcp"}},  # on its socket it has no port
    )
    with pytest.raises(ConfigError) as caught:
        load_reload(running, config)
    assert "gateway" in caught.value.message and "8100" in caught.value.message
    assert caught.value.fix is not None and "restart the daemon" in caught.value.fix


def test_a_reload_that_fits_the_kept_gateway_is_taken(tmp_path: Path) -> None:
    """The gateway moved in the file, the deployments fit the running one: the running gateway stays, waiting."""
    running = Settings(gateway=GatewaySettings(listen="127.0.0.1:8100"), hf_cache_dir=tmp_path / "hf")
    config = write_config(
        tmp_path / "dankserve.toml",
        {"hf_cache_dir": str(tmp_path / "hf"), "gateway": {"listen": "127.0.0.1:8200"}},
        {"chat": {"model": "org/chat", "port": 8300}},
    )
    effects = load_reload(running, config)
    assert effects.needs_restart == ("gateway",)
    assert effects.settings.gateway == running.gateway and set(effects.settings.deployments) == {"chat"}
