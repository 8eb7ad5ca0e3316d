"""Security: what dankserve writes (state, learned KV sizes, control socket, pid, logs, process
records, caches) is readable by its owner only: files 0600 in 0700 directories.

The daemon runs as a user runs it: `dankserve up` starts it in the background (no systemd
here, so without the unit's UMask=0077), with the stand-in as a process-runtime server.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dankserve.testing.config_file import write_config
from tests.harness.daemon import free_port, process_deployment, write_host
from tests.harness.modes import modes_not_private

pytestmark = pytest.mark.slow


def dankserve(config: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dankserve", "--config", str(config), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_state_caches_socket_and_records_are_owner_only(tmp_path: Path) -> None:
    """After a boot that learned its KV size, every file of the state and cache dirs is 0600 in 0700 dirs."""
    state, cache = tmp_path / "state", tmp_path / "cache"
    config = write_config(
        tmp_path / "dankserve.toml",
        {
            "state_dir": str(state),
            "cache_dir": str(cache),
            "hf_cache_dir": str(cache / "huggingface"),
            "vllm_version": "0.33.0",
            "log_format": "json",
        },
        {"chat": process_deployment(free_port())},
    )
    env = {**os.environ, "DANKSERVE_HARDWARE": str(write_host(tmp_path / "host.json"))}
    env.pop("NOTIFY_SOCKET", None)
    old_umask = os.umask(0o022)  # what a login shell has: the daemon must not rely on it
    try:
        up = dankserve(config, "up", "--timeout", "60", env=env)
    finally:
        os.umask(old_umask)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        present = {p.name for p in state.iterdir()}
        assert {"state.json", "control.sock", "daemon.pid", "daemon.lock", "daemon.log", "processes"} <= present
        assert any(cache.rglob("*")), "the compile cache is empty"
        assert modes_not_private(state) == []
        assert modes_not_private(cache) == []
    finally:
        down = dankserve(config, "down", env=env)
        assert down.returncode == 0, down.stdout + down.stderr
    assert modes_not_private(state) == []
