"""Issue 39.3: a second terminal without the first one's exports (no --config, no DANKSERVE_CONFIG).

With the default config file absent, the commands that reach the daemon used to read no file at all,
look for a daemon in the default state dir and answer wrongly while the user's daemon served:
`status` "daemon not running" exit 0, `down` "not running" exit 0, `logs -f` waiting silently. Each
now says that the file it would read does not exist, exit 2, as `--config` of a missing file does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dankserve.settings.files import DEFAULT_CONFIG_PATH
from tests.harness.daemon import free_port, process_deployment, running_daemon

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(DEFAULT_CONFIG_PATH.exists(), reason="this host has a default config file"),
]


def bare_env() -> dict[str, str]:
    """This process's environment without DANKSERVE_* variables (a fresh terminal's)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("DANKSERVE_", "NOTIFY_SOCKET"))}


def bare(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`dankserve ARGS...` as a fresh terminal runs it: no --config, no DANKSERVE_* variables."""
    env = bare_env()
    return subprocess.run(
        [sys.executable, "-m", "dankserve", *args],
        capture_output=True,
        text=True,
        env={**env, "HOME": str(tmp_path)},
        cwd=tmp_path,
        timeout=60,
        check=False,
    )


def test_a_terminal_without_the_exports_is_told_the_config_file_does_not_exist(tmp_path: Path) -> None:
    """While a daemon serves, status, down, logs -f, restart and sleep without a config exit 2 naming the missing
    file and the variable to set; the daemon goes on serving."""
    with running_daemon(tmp_path, {"chat": process_deployment(free_port())}) as daemon:
        daemon.wait_for("chat", lambda d: d["state"] == "ready", timeout=120)
        for args in (["status"], ["down"], ["logs", "-f"], ["logs", "--previous", "chat"], ["restart", "chat"]):
            done = bare(tmp_path, *args)
            assert done.returncode == 2, (args, done.stdout, done.stderr)
            assert f"config file {DEFAULT_CONFIG_PATH} does not exist" in done.stderr, (args, done.stderr)
            assert "DANKSERVE_CONFIG" in done.stderr and "--config" in done.stderr, done.stderr
            assert "not running" not in done.stdout + done.stderr
        assert daemon.deployment("chat")["state"] == "ready"  # type: ignore[index]
        # the state dir alone still names the daemon
        done = subprocess.run(
            [sys.executable, "-m", "dankserve", "status"],
            capture_output=True,
            text=True,
            env={**bare_env(), "DANKSERVE_STATE_DIR": str(daemon.state_dir), "HOME": str(tmp_path)},
            cwd=tmp_path,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0 and "chat" in done.stdout, done.stdout + done.stderr
