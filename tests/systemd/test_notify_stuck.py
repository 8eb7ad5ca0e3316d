"""Issue 39.15 through a real daemon: its NOTIFY_SOCKET's reader has stopped draining (a stuck PID 1)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.harness.daemon import free_port, process_deployment, running_daemon
from tests.systemd.test_notify import fill

pytestmark = pytest.mark.slow


def test_a_daemon_whose_notify_queue_is_full_still_serves_reloads_and_stops(tmp_path: Path) -> None:
    """The notify socket's queue is full before the daemon starts and nobody reads it: the daemon's main loop
    does not hang in sd_notify: the deployment turns ready, `dankserve reload` is answered, SIGTERM stops it (0)."""
    stuck_path = tmp_path / "stuck.sock"
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stuck.bind(str(stuck_path))
    try:
        assert fill(str(stuck_path)) > 0
        env = {"NOTIFY_SOCKET": str(stuck_path)}
        with running_daemon(tmp_path, {"chat": process_deployment(free_port())}, extra_env=env) as daemon:
            daemon.wait_for("chat", lambda d: d["state"] == "ready", timeout=120)
            reload = daemon.cli("reload", timeout=60)
            assert reload.returncode == 0, reload.stdout + reload.stderr
            assert daemon.stop(timeout=30) == 0
    finally:
        stuck.close()
