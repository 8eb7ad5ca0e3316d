"""The daemon's side of the launcher's socket (protocol: dankserve/launcher/protocol.py).

An edge: one short connection per request. `LauncherUnreachable` means the launcher did not
answer (gone, not yet listening, or its socket removed); a refusal it answers is `LauncherRefused`.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dankserve.launcher import protocol
from dankserve.runtime.base import LaunchRequest


class LauncherUnreachable(Exception):
    """The launcher's socket did not answer."""


class LauncherRefused(Exception):
    """The launcher answered with an error."""


@dataclass(frozen=True)
class ServerInfo:
    id: int
    pid: int
    mode: str
    mode_reason: str
    fingerprint: str | None
    exited: bool
    exit_code: int | None
    oom_killed: bool

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ServerInfo:
        return cls(
            id=int(data["id"]),
            pid=int(data["pid"]),
            mode=str(data.get("mode", "")),
            mode_reason=str(data.get("mode_reason", "")),
            fingerprint=None if data.get("fingerprint") is None else str(data["fingerprint"]),
            exited=bool(data.get("exited")),
            exit_code=None if data.get("exit_code") is None else int(data["exit_code"]),
            oom_killed=bool(data.get("oom_killed")),
        )


@dataclass(frozen=True)
class LauncherStatus:
    version: int
    pid: int
    import_state: str
    import_seconds: float | None
    import_threads: tuple[str, ...]
    server: ServerInfo | None


def socket_path(run_dir: Path) -> Path:
    return run_dir / protocol.SOCKET_NAME


class LauncherClient:
    """Requests to the launcher listening in `run_dir`."""

    def __init__(self, run_dir: Path) -> None:
        self.path = socket_path(run_dir)

    def _call(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(timeout)
                with protocol.socket_address(str(self.path)) as address:
                    conn.connect(address)
                conn.sendall(protocol.encode(message))
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                    if len(data) > protocol.MAX_MESSAGE_BYTES:
                        raise LauncherUnreachable("the launcher's answer is too large")
        except OSError as exc:
            raise LauncherUnreachable(f"{self.path}: {exc.strerror or exc}") from None
        try:
            answer = protocol.decode(data)
        except ValueError:
            raise LauncherUnreachable(f"{self.path}: no answer to {message.get('op')!r}") from None
        if not answer.get("ok"):
            raise LauncherRefused(str(answer.get("error") or "refused"))
        return answer

    def status(self, timeout: float = 5.0) -> LauncherStatus:
        answer = self._call({"op": "status"}, timeout)
        server = answer.get("server")
        return LauncherStatus(
            version=int(answer.get("version") or 0),
            pid=int(answer.get("pid") or 0),
            import_state=str(answer.get("import")),
            import_seconds=answer.get("import_seconds"),
            import_threads=tuple(str(t) for t in answer.get("import_threads") or ()),
            server=ServerInfo.from_json(server) if server else None,
        )

    def wait_listening(self, timeout: float) -> None:
        """Until the launcher answers `status` (a new container takes a moment), else LauncherUnreachable."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.status(timeout=2.0)
                return
            except LauncherUnreachable:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def start(self, server_id: int, request: LaunchRequest, fingerprint: str | None, timeout: float) -> ServerInfo:
        """Start a server; the answer may wait for the pre-import (up to `timeout`)."""
        message = {
            "op": "start",
            "server_id": server_id,
            "argv": list(request.argv),
            "env": dict(request.env),
            "env_files": dict(request.env_files),
            "fingerprint": fingerprint,
        }
        return ServerInfo.from_json(self._call(message, timeout)["server"])

    def wait(self, timeout: float) -> ServerInfo | None:
        """The server once exited (None: still running after `timeout`)."""
        answer = self._call({"op": "wait", "timeout": timeout}, timeout + 5.0)
        server = answer.get("server")
        if not answer.get("exited"):
            return None
        return ServerInfo.from_json(server) if server else None

    def stop(self, timeout: float) -> ServerInfo | None:
        answer = self._call({"op": "stop", "timeout": timeout}, timeout + 35.0)
        server = answer.get("server")
        return ServerInfo.from_json(server) if server else None
