"""Tests for dankserve.launcher.protocol: messages and one server's lines out of a launcher's log."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from dankserve.launcher import protocol


def test_messages_round_trip_and_must_be_objects() -> None:
    """A message is one JSON line; anything but an object is refused."""
    assert protocol.decode(protocol.encode({"op": "status"})) == {"op": "status"}
    with pytest.raises(ValueError, match="JSON object"):
        protocol.decode(b"[1]\n")


def test_a_servers_lines_are_those_between_its_markers() -> None:
    """Lines of earlier servers and of the launcher itself are skipped; the stream ends at the exit marker."""
    log = [
        "dankserve-launcher: listening on launcher.sock (pid 1)",
        protocol.started_line(1, "fork", "forked"),
        "first server",
        protocol.exited_line(1, -9, oom_killed=False),
        "dankserve-launcher: server 2 starting (fork)",
        protocol.started_line(2, "plain", "--numa-bind"),
        "INFO second server",
        "dankserve-launcher: vLLM imported in 1.0 s; threads: python3",
        "ready",
        protocol.exited_line(2, 1, oom_killed=False),
        "never read",
    ]
    assert list(protocol.server_lines(iter(log), 2)) == ["INFO second server", "ready"]
    assert list(protocol.server_lines(iter(log), 1)) == ["first server"]
    assert list(protocol.server_lines(iter(log), 3)) == []


def test_the_exit_marker_says_an_oom_kill() -> None:
    """An OOM-killed server's marker names the OOM killer, not a bare signal."""
    assert "OOM killer" in protocol.exited_line(4, -9, oom_killed=True)


def test_a_socket_path_longer_than_a_unix_address_is_reached_through_its_directory(tmp_path: Path) -> None:
    """A path over 107 bytes binds and connects through /proc/self/fd; a short one is used as it is."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = str(deep / protocol.SOCKET_NAME)
    with protocol.socket_address(path) as address:
        assert address.startswith("/proc/self/fd/")
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(address)
            listener.listen(1)
            with protocol.socket_address(path) as again, socket.socket(socket.AF_UNIX) as client:
                client.connect(again)
    assert Path(path).exists()
    with protocol.socket_address("/run/x.sock") as short:
        assert short == "/run/x.sock"


GOOD_START = {
    "op": "start",
    "server_id": 1,
    "argv": ["m"],
    "env": {"A": "1"},
    "env_files": {"K": "/run/secrets/api_key"},
}


@pytest.mark.parametrize(
    "request_",
    [
        {"op": "status"},
        {"op": "wait", "timeout": 5},
        {"op": "stop", "timeout": 0.5},
        {"op": "shutdown"},
        GOOD_START,
        {**GOOD_START, "fingerprint": "abc"},
    ],
)
def test_what_the_daemon_sends_is_accepted(request_: dict[str, Any]) -> None:
    """Every request shape the daemon sends passes."""
    assert protocol.request_problem(request_) is None


@pytest.mark.parametrize(
    ("request_", "problem"),
    [
        ({"op": "fly"}, "unknown op"),
        ({"op": "wait", "timeout": "x"}, "number"),
        ({"op": "wait", "timeout": True}, "number"),
        ({"op": "wait", "timeout": float("nan")}, "between"),
        ({"op": "stop", "timeout": float("inf")}, "between"),
        ({"op": "stop", "timeout": -1}, "between"),
        ({**GOOD_START, "server_id": "1"}, "server_id"),
        ({**GOOD_START, "argv": "m"}, "argv"),
        ({**GOOD_START, "argv": ["a\x00b"]}, "argv"),
        ({**GOOD_START, "env": {"=X": "1"}}, "env"),
        ({**GOOD_START, "env": {"A": 1}}, "env"),
        ({**GOOD_START, "env_files": {"K": "/etc/shadow"}}, "/run/secrets"),
        ({**GOOD_START, "env_files": {"K": "/run/secrets/../../etc/shadow"}}, "/run/secrets"),
        ({**GOOD_START, "fingerprint": 3}, "fingerprint"),
    ],
)
def test_anything_else_is_refused_with_the_reason(request_: dict[str, Any], problem: str) -> None:
    """A field of another type, range or place is refused, naming it."""
    found = protocol.request_problem(request_)
    assert found is not None and problem in found
