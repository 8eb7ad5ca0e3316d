"""Security: the daemon's /metrics under a flood of idle connections from a local user, and SIGTERM while
the daemon is out of descriptors (issue 26, finding 3).

A real `dankserve run` with a soft descriptor limit of 1024 (a login shell's), the stand-in as a
process-runtime server health-checked every 0.3 s, and 1100 connections to /metrics that never send
a byte: the daemon keeps its descriptors, its server (boots stay 1) and its control socket, and
SIGTERM in that state stops the server.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.harness.daemon import RunningDaemon, free_port, process_deployment, running_daemon
from tests.harness.faults import descriptors_exhausted
from tests.harness.wait import hold_for, stays_true

pytestmark = pytest.mark.slow

NOFILE = 256
"""The daemon's soft descriptor limit at start (a login shell has 1024; less makes the flood quicker)."""
FLOOD = 400


def server_pid(daemon: RunningDaemon) -> int:
    pid: int = json.loads((daemon.state_dir / "processes" / "chat.json").read_text())["pid"]
    return pid


@contextlib.contextmanager
def idle_connections(port: int, count: int, seconds: float) -> Iterator[list[socket.socket]]:
    """Up to `count` connections to 127.0.0.1:port that never send a byte, opened by 8 threads within
    `seconds` (a server out of descriptors stops accepting; connecting then waits)."""
    held: list[socket.socket] = []
    deadline = time.monotonic() + seconds

    def connect() -> None:
        while len(held) < count and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                held.append(socket.create_connection(("127.0.0.1", port), timeout=1))

    openers = [threading.Thread(target=connect, daemon=True) for _ in range(8)]
    for opener in openers:
        opener.start()
    try:
        for opener in openers:
            opener.join(seconds + 2)
        yield held
    finally:
        for sock in held:
            sock.close()


def scrape(port: int, key: str | None = None) -> tuple[int, str]:
    """GET /metrics: the HTTP status and body."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_idle_connections_to_metrics_cost_the_daemon_nothing(tmp_path: Path) -> None:
    """400 idle /metrics connections against a daemon started with 256 descriptors: it keeps fewer than
    that open, its server is never restarted, its control socket answers, SIGTERM stops the server."""
    metrics = free_port()
    with running_daemon(
        tmp_path,
        {"chat": process_deployment(free_port())},
        extra_globals={"health_interval_seconds": 0.3, "metrics_listen": f"127.0.0.1:{metrics}"},
        nofile=NOFILE,
    ) as daemon:
        daemon.wait_for("chat", lambda d: d["state"] == "ready")
        assert daemon.proc is not None
        pid = server_pid(daemon)
        with idle_connections(metrics, FLOOD, seconds=40):
            fds = f"/proc/{daemon.proc.pid}/fd"
            # ten health checks with the flood held, the daemon's descriptors watched all along
            stays_true(lambda: len(os.listdir(fds)) < NOFILE, 3.0, 0.2, what=f"fewer than {NOFILE} descriptors")
            status = daemon.status()
            assert status is not None, daemon.log_tail()
            chat = next(d for d in status["deployments"] if d["name"] == "chat")
            assert chat["state"] == "ready" and chat["boots"] == 1 and chat["restarts"] == 0, chat
            assert daemon.stop(timeout=30) == 0
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert not daemon.events_named("health_failed")
        assert daemon.events_named("descriptor_limit_raised")


def test_a_metrics_key_is_required_when_set(tmp_path: Path) -> None:
    """With metrics_api_key_file, a scrape without the key or with another gets 401; with it, the metrics."""
    key = tmp_path / "metrics.key"
    key.write_text("metrics-key-0123456789\n")
    key.chmod(0o600)
    metrics = free_port()
    globals_ = {"metrics_listen": f"127.0.0.1:{metrics}", "metrics_api_key_file": str(key)}
    with running_daemon(tmp_path, {"chat": process_deployment(free_port())}, extra_globals=globals_) as daemon:
        daemon.wait_for("chat", lambda d: d["state"] == "ready")
        assert scrape(metrics)[0] == 401
        assert scrape(metrics, "wrong-key")[0] == 401
        status, body = scrape(metrics, "metrics-key-0123456789")
        assert status == 200 and 'dankserve_deployment_state{deployment="chat",state="ready"} 1.0' in body


def test_sigterm_while_out_of_descriptors_still_stops_the_server(tmp_path: Path) -> None:
    """SIGTERM while the daemon cannot open a descriptor: the stop is tried again and the server stopped once
    descriptors are back (2 s later); exit 0. It used to exit 0 at once and leave the server running."""
    with running_daemon(tmp_path, {"chat": process_deployment(free_port())}) as daemon:
        daemon.wait_for("chat", lambda d: d["state"] == "ready")
        assert daemon.proc is not None
        pid = server_pid(daemon)
        with contextlib.suppress(psutil.Error), descriptors_exhausted(daemon.proc.pid):
            daemon.signal(signal.SIGTERM)
            hold_for(2.0, "descriptors stay exhausted 2 s after the SIGTERM, so the stop must be tried again")
        assert daemon.proc.wait(60) == 0, daemon.log_tail()
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_server_the_daemon_could_not_stop_is_an_exit_3(tmp_path: Path) -> None:
    """Out of descriptors for good: SIGTERM ends in exit 3 and servers_left_running naming the deployment."""
    with running_daemon(tmp_path, {"chat": process_deployment(free_port())}) as daemon:
        daemon.wait_for("chat", lambda d: d["state"] == "ready")
        assert daemon.proc is not None
        pid = server_pid(daemon)
        try:
            with contextlib.suppress(psutil.Error), descriptors_exhausted(daemon.proc.pid):
                daemon.signal(signal.SIGTERM)
                assert daemon.proc.wait(60) == 3, daemon.log_tail()
            left = daemon.events_named("servers_left_running")
            assert left and left[0]["deployments"] == ["chat"], daemon.log_tail()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
