"""Tests for dankserve.cluster.api: a real server on loopback, the token gate, the client's errors."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from dankserve.aioserver import bearer_matches
from dankserve.cluster.api import (
    ClusterClient,
    ClusterServer,
    read_token,
    split_address,
)
from dankserve.errors import ConfigError, MemberUnreachable
from tests.harness.certs import HostCert, group_certs

TOKEN = "s3cret-token-0123456789abcdef"


class Recorder:
    """A handler that records what it was asked to do."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def status(self) -> dict[str, Any]:
        self.calls.append(("status", {}))
        return {"ok": True, "worker": None}

    def start_worker(self, request: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(("start", dict(request)))
        return {"ok": True, "started": True}

    def stop_worker(self, request: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(("stop", dict(request)))
        if request.get("deployment") == "boom":
            raise RuntimeError("exploded")
        return {"ok": True}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> HostCert:
    """The group's CA and one certificate for 127.0.0.1 (both ends of every test connection)."""
    return group_certs(tmp_path_factory.mktemp("certs"), ["127.0.0.1"])["127.0.0.1"]


@pytest.fixture
def served(certs: HostCert) -> Iterator[tuple[ClusterServer, Recorder]]:
    handler = Recorder()
    server = ClusterServer(("127.0.0.1", 0), TOKEN, handler, certs.tls().server)
    server.start()
    yield server, handler
    server.close()


def client(server: ClusterServer, certs: HostCert, token: str = TOKEN, **kwargs: Any) -> ClusterClient:
    return ClusterClient(address(server), token, certs.tls().client, **kwargs)


def address(server: ClusterServer) -> str:
    host, port = server.address
    return f"{host}:{port}"


def raw(
    server: ClusterServer,
    certs: HostCert,
    method: str,
    path: str,
    headers: dict[str, str],
    *,
    body: bytes | None = None,
) -> int:
    conn = http.client.HTTPSConnection(*server.address, timeout=3, context=certs.tls().client)
    conn.request(method, path, body=body, headers=headers)
    status = conn.getresponse().status
    conn.close()
    return status


def test_client_calls_every_endpoint(served: tuple[ClusterServer, Recorder], certs: HostCert) -> None:
    """With the right token, status, start-worker and stop-worker reach the handler with their bodies."""
    server, handler = served
    member = client(server, certs)
    assert member.status() == {"ok": True, "worker": None}
    assert member.start_worker({"deployment": "big", "head": "10.0.0.1:6379"})["started"] is True
    member.stop_worker({"deployment": "big"})
    assert handler.calls == [
        ("status", {}),
        ("start", {"deployment": "big", "head": "10.0.0.1:6379"}),
        ("stop", {"deployment": "big"}),
    ]


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token-0123456789abcdef"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": TOKEN},
        {"Authorization": f"Basic {TOKEN}"},
    ],
)
@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/v1/status"), ("POST", "/v1/start-worker"), ("POST", "/v1/stop-worker")]
)
def test_no_valid_token_no_action(
    served: tuple[ClusterServer, Recorder], certs: HostCert, headers: dict[str, str], method: str, path: str
) -> None:
    """Without the exact token every endpoint answers 401 and the handler is never called."""
    server, handler = served
    body = json.dumps({"deployment": "big"}).encode() if method == "POST" else None
    assert raw(server, certs, method, path, headers, body=body) == 401
    assert handler.calls == []


def test_wrong_token_is_a_config_error(served: tuple[ClusterServer, Recorder], certs: HostCert) -> None:
    """A client with another token gets a ConfigError (exit 2) naming the member and the fix."""
    server, _ = served
    with pytest.raises(ConfigError, match="refused this daemon's cluster token"):
        client(server, certs, "another-token-0123456789").status()


def test_unknown_path_and_bad_body(served: tuple[ClusterServer, Recorder], certs: HostCert) -> None:
    """An unknown endpoint is 404 and a non-object body 400, both without calling the handler."""
    server, handler = served
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert raw(server, certs, "GET", "/v1/secrets", auth) == 404
    assert raw(server, certs, "POST", "/v1/start-worker", {**auth, "Content-Length": "2"}, body=b"[]") == 400
    assert handler.calls == []


def test_handler_error_is_reported(served: tuple[ClusterServer, Recorder], certs: HostCert) -> None:
    """A handler that raises answers 500 and the client reports the member's error text."""
    server, _ = served
    with pytest.raises(MemberUnreachable, match="exploded"):
        client(server, certs).stop_worker({"deployment": "boom"})


def test_unreachable_member(certs: HostCert) -> None:
    """A closed port is MemberUnreachable (retried by the group), not a user error."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(MemberUnreachable):
        ClusterClient(f"127.0.0.1:{port}", TOKEN, certs.tls().client, timeout=1).status()


def test_server_binds_only_the_named_address(served: tuple[ClusterServer, Recorder]) -> None:
    """The server listens on the configured address, not on every interface."""
    server, _ = served
    assert server.address[0] == "127.0.0.1"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("10.0.0.2:7390", ("10.0.0.2", 7390)), ("10.0.0.2", ("10.0.0.2", 7390)), ("[fd00::2]:81", ("fd00::2", 81))],
)
def test_split_address(text: str, expected: tuple[str, int]) -> None:
    """Addresses are HOST:PORT, a bare HOST (default port) or [IPv6]:PORT."""
    assert split_address(text, 7390) == expected


def test_bearer_matches_only_bearer() -> None:
    """Only 'Bearer TOKEN' with the exact token matches."""
    assert bearer_matches(f"Bearer {TOKEN}", TOKEN)
    assert not bearer_matches(None, TOKEN)
    assert not bearer_matches(f"bearer {TOKEN}", TOKEN)


def test_read_token(tmp_path: Path) -> None:
    """A token file is read and stripped; missing or short tokens are config errors."""
    good = tmp_path / "token"
    good.write_text(TOKEN + "\n")
    good.chmod(0o600)
    assert read_token(good) == TOKEN
    with pytest.raises(ConfigError, match="cannot read"):
        read_token(tmp_path / "absent")
    short = tmp_path / "short"
    short.write_text("abc")
    short.chmod(0o600)
    with pytest.raises(ConfigError, match="at least 16"):
        read_token(short)
