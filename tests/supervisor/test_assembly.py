"""Tests for dankserve.supervisor.assembly: the checks before the daemon supervises anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from dankserve.errors import ConfigError
from dankserve.settings import load_settings
from dankserve.supervisor.assembly import build_daemon
from dankserve.testing import HOSTS_DIR

HOST = HOSTS_DIR / "h200x2-vm-real.json"


def test_a_configuration_error_wins_over_an_unreachable_runtime(
    tmp_path: Path, hub_environment: dict[str, str]
) -> None:
    """A deployment that cannot be planned is reported (exit 2) even when an earlier one's Podman is unreachable."""
    config = tmp_path / "dankserve.toml"
    config.write_text(
        f'podman_url = "unix://{tmp_path}/absent.sock"\nstate_dir = "{tmp_path}/state"\n'
        '[deployments.first]\nmodel = "m/m"\ngpus = [0]\nport = 8001\n'
        '[deployments.second]\nmodel = "m/m"\ngpus = [7]\nport = 8002\n'
    )
    settings = load_settings(config, environ={})
    with pytest.raises(ConfigError, match="GPU 7"):
        build_daemon(settings, hardware_file=HOST, config_path=config)
