"""Tests for `dankserve logs` with a real daemon and server (process runtime, no journald)."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.daemon import free_port, process_deployment, running_daemon

pytestmark = pytest.mark.slow


def test_logs_show_the_daemons_lines_and_the_servers_own(tmp_path: Path) -> None:
    """logs prints the daemon's events and the server's output, prefixed with the workload's name."""
    with running_daemon(tmp_path, {"chat": process_deployment(free_port())}) as daemon:
        daemon.wait_for("chat", lambda d: d["state"] == "ready")
        (daemon.state_dir / "daemon.log").write_text(daemon.log_path.read_text())
        done = subprocess.run(
            [sys.executable, "-m", "dankserve", "--config", str(daemon.config), "logs", "chat", "-n", "400"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    assert "dankserve-chat: " in done.stdout
    assert any(
        line.startswith("dankserve-chat: ") and "Application startup complete." in line
        for line in done.stdout.splitlines()
    )
    assert '"event": "ready"' in done.stdout
