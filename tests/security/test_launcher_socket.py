"""Security: the launcher's socket accepts only what the daemon sends (issue 26, finding 9).

A real daemon runs the stand-in under the launcher (process runtime); the test, as root, speaks to
the launcher's socket directly: a `timeout` that is text or NaN, `env_files` naming a file outside
the Podman secrets, an argv that is not a list of strings, a request dripped a byte at a time.
Each is refused in words or cut off; the launcher, its server and the deployment go on (boots 1).
A `"timeout": "x"` used to kill the launcher and its server and count as a boot failure.
"""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from dankserve.launcher import protocol
from tests.harness.daemon import RunningDaemon, free_port, launcher_deployment, running_daemon
from tests.harness.wait import hold_for, stays_true
from tests.supervisor.test_daemon_launcher import alive, launcher, launcher_pid, server_pid

pytestmark = pytest.mark.slow

HOSTILE: list[bytes] = [
    b'{"op": "wait", "timeout": "x"}\n',
    b'{"op": "wait", "timeout": NaN}\n',
    b'{"op": "stop", "timeout": -1}\n',
    b'{"op": "start", "server_id": 9, "argv": ["m"], "env": {}, "env_files": {"X": "/etc/shadow"}}\n',
    b'{"op": "start", "server_id": 9, "argv": "m", "env": {"=X": 1}}\n',
]


def ask(daemon: RunningDaemon, payload: bytes, drip: float = 0.0, seconds: float = 10.0) -> dict[str, Any] | None:
    """Send `payload` to chat's launcher (a byte every `drip` seconds, for at most `seconds`); its answer,
    or None when it closed the connection without one."""
    path = str(daemon.state_dir / "launchers" / "chat" / protocol.SOCKET_NAME)
    with socket.socket(socket.AF_UNIX) as conn, protocol.socket_address(path) as address:
        conn.settimeout(seconds)
        conn.connect(address)
        deadline = time.monotonic() + seconds
        pieces = [payload[i : i + 1] for i in range(len(payload))] if drip else [payload]
        with contextlib.suppress(OSError):
            for piece in pieces:
                if time.monotonic() > deadline:
                    break
                conn.sendall(piece)
                if drip:
                    hold_for(drip, "a deliberately slow client: one byte per drip")
        data = b""
        with contextlib.suppress(OSError):
            while not data.endswith(b"\n") and (chunk := conn.recv(65536)):
                data += chunk
    return protocol.decode(data) if data else None


def test_hostile_requests_to_the_launcher_change_nothing(tmp_path: Path) -> None:
    """Each hostile request is refused in words; a dripped one is cut off; the server keeps serving, boots 1."""
    with running_daemon(tmp_path, {"chat": launcher_deployment(free_port())}) as daemon:
        daemon.wait_for("chat", lambda d: d["state"] == "ready")
        pids = launcher_pid(daemon, "chat"), server_pid(daemon, "chat")
        for payload in HOSTILE:
            answer = ask(daemon, payload)
            assert answer is not None and answer["ok"] is False and "malformed" in answer["error"], (payload, answer)
        started = time.monotonic()
        dripped = ask(daemon, b'{"op": "status"}\n', drip=0.5, seconds=8.0)
        assert time.monotonic() - started < protocol.READ_SECONDS + 3.0
        assert dripped is None or dripped["ok"] is False
        assert launcher(daemon, "chat").server is not None  # the socket answers again
        assert all(alive(pid) for pid in pids)
        # a few health checks later: still the same launcher and server, ready
        stays_true(
            lambda: all(alive(pid) for pid in pids) and (daemon.deployment("chat") or {}).get("state") == "ready",
            2.0,
            0.2,
            what="the launcher and server alive and chat ready",
        )
        chat = daemon.wait_for("chat", lambda d: d["state"] == "ready")
        assert chat["boots"] == 1 and chat["restarts"] == 0 and chat["last_failure"] is None, chat
