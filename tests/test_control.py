"""Tests for dankserve.control over a real Unix socket."""

import stat
from pathlib import Path
from typing import Any

from dankserve.control import ControlServer, request


def test_request_reaches_handler_and_returns_reply(tmp_path: Path) -> None:
    """A request is handed to the handler and its reply comes back."""
    seen: list[dict[str, Any]] = []

    def handler(message: dict[str, Any]) -> dict[str, Any]:
        seen.append(message)
        return {"ok": True, "echo": message["command"]}

    server = ControlServer(tmp_path / "control.sock", handler)
    server.start()
    try:
        assert request(tmp_path / "control.sock", {"command": "status"}) == {"ok": True, "echo": "status"}
        assert seen == [{"command": "status"}]
    finally:
        server.close()


def test_socket_is_owner_only_and_removed_on_close(tmp_path: Path) -> None:
    """The socket file is 0600 and gone after close."""
    server = ControlServer(tmp_path / "control.sock", lambda m: {"ok": True})
    server.start()
    mode = stat.S_IMODE((tmp_path / "control.sock").stat().st_mode)
    server.close()
    assert mode == 0o600
    assert not (tmp_path / "control.sock").exists()


def test_no_daemon_gives_none(tmp_path: Path) -> None:
    """Asking where no daemon listens gives None, not an exception."""
    assert request(tmp_path / "control.sock", {"command": "status"}) is None


def test_handler_errors_become_replies(tmp_path: Path) -> None:
    """A failing handler answers with an error instead of dropping the connection."""

    def handler(message: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("boom")

    server = ControlServer(tmp_path / "control.sock", handler)
    server.start()
    try:
        reply = request(tmp_path / "control.sock", {"command": "x"})
        assert reply is not None
        assert reply["ok"] is False
        assert "boom" in reply["error"]
    finally:
        server.close()
