"""The daemon's control socket: one JSON request and one JSON reply per connection.

The socket lives in the state directory (0700, root's), so only root can ask the daemon to
start or stop a deployment. Requests: {"command": "status"}, {"command": "up", "deployment": N},
{"command": "down", "deployment": N}, {"command": "sleep"|"wake", "deployment": N},
{"command": "reload"} (answered once applied: {"reload": {"accepted", "refused", "restart", "start",
"stop", "keep", "applied", "needs_restart", "adapters"}}) and {"command": "settings"} (the settings the daemon
runs with, global keys waiting for a restart at their running values, for a CLI whose config file on
disk does not validate).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dankserve.errors import resources_exhausted

SOCKET_NAME = "control.sock"
MAX_MESSAGE = 1 << 20

Handler = Callable[[dict[str, Any]], dict[str, Any]]


def socket_path(state_dir: Path) -> Path:
    """Where a daemon using `state_dir` listens."""
    return state_dir / SOCKET_NAME


class ControlServer:
    """Serves control requests on a Unix socket in a background thread."""

    def __init__(self, path: Path, handler: Handler) -> None:
        self.path = path
        self._handler = handler
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()

    def start(self) -> None:
        """Bind the socket (replacing a stale one) and begin serving."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old_umask)
        sock.listen(16)
        sock.settimeout(0.5)
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name="control", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and remove the socket file."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._sock is not None:
            self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _serve(self) -> None:
        assert self._sock is not None
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if resources_exhausted(exc) is None:
                    return  # closed
                # Out of descriptors for now (a peer holding many open): keep serving once they are back.
                self._closed.wait(0.1)
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                request = json.loads(_read_message(conn))
                if not isinstance(request, dict):
                    raise ValueError("request must be a JSON object")
                reply = self._handler(request)
            except (ValueError, OSError) as exc:
                reply = {"ok": False, "error": f"bad request: {exc}"}
            except Exception as exc:  # a handler bug must not kill the control thread
                reply = {"ok": False, "error": f"internal error: {type(exc).__name__}: {exc}"}
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps(reply).encode() + b"\n")


def request(path: Path, message: dict[str, Any], timeout: float = 10.0) -> dict[str, Any] | None:
    """Send one request; the reply, or None when no daemon listens at `path`."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    with sock:
        sock.sendall(json.dumps(message).encode() + b"\n")
        reply = json.loads(_read_message(sock))
    return reply if isinstance(reply, dict) else None


def _read_message(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_MESSAGE:
            raise ValueError("message too large")
    return data
