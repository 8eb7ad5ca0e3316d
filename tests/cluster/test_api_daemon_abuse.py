"""Issue 12's attack on a real daemon: 1,021 half-sent requests to its cluster API while it serves.

Before the fix the daemon ran out of file descriptors (EMFILE in its health checks), killed its
healthy server and left the deployment `failed`. Now the API holds at most max_connections
of them, each for at most header_timeout, and the deployment never notices.
"""

from __future__ import annotations

import os
import resource
import socket
from pathlib import Path

import pytest

from tests.harness.certs import group_certs
from tests.harness.daemon import free_port, process_deployment, running_daemon
from tests.harness.wait import stays_true

pytestmark = pytest.mark.slow

TOKEN = "group-token-0123456789abcdef0123"


def test_half_sent_requests_neither_exhaust_descriptors_nor_kill_a_healthy_deployment(tmp_path: Path) -> None:
    """The deployment stays ready with no restart and the daemon's descriptors stay bounded, during and after."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    certs = group_certs(tmp_path / "certs", ["127.0.0.1"])["127.0.0.1"]
    api_port = free_port()
    cluster = {
        "listen": f"127.0.0.1:{api_port}",
        "token_file": str(token),
        "max_connections": 64,
        "header_timeout_seconds": 2.0,
        **certs.settings(),
    }
    # The daemon starts with the usual soft limit of 1024 descriptors (as under a plain unit);
    # this process then takes more for the attackers.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 1024), hard))
    with running_daemon(
        tmp_path, {"chat": process_deployment(free_port())}, extra_globals={"cluster": cluster}
    ) as daemon:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
        daemon.wait_for("chat", lambda d: d["state"] == "ready")
        assert daemon.proc is not None
        fds = Path(f"/proc/{daemon.proc.pid}/fd")
        baseline = len(os.listdir(fds))
        attackers: list[socket.socket] = []
        try:
            for index in range(1021):
                sock = socket.create_connection(("127.0.0.1", api_port), timeout=5)
                sock.sendall(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n" if index % 2 else b"\x16\x03\x01")
                attackers.append(sock)
            peaks = [baseline]

            def serving() -> bool:
                peaks.append(len(os.listdir(fds)))
                chat = daemon.deployment("chat")
                return chat is not None and chat["state"] == "ready"

            # the attack held for two health checks and three header timeouts, watched all along
            stays_true(serving, 6, 0.2, what="chat ready with the attackers' connections held")
            peak = max(peaks)
        finally:
            for sock in attackers:
                sock.close()
        assert peak <= baseline + 64 + 16, f"descriptors grew from {baseline} to {peak}"
        chat = daemon.deployment("chat")
        assert chat is not None and chat["state"] == "ready" and chat["restarts"] == 0
        assert "EMFILE" not in daemon.log_tail(400) and "Too many open files" not in daemon.log_tail(400)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
