"""The cluster API under abuse (issue 12): real sockets against a real server, TLS included.

Each test is a hole a probe found, or one TLS closes: half-sent requests held open, lengths that
lie, bodies too large in every form, slow bodies, peers without the group's certificate.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import ssl
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from dankserve.aioserver import Limits, overflow
from dankserve.cluster.api import MAX_BODY, ClusterClient, ClusterServer
from dankserve.errors import MemberUnreachable
from tests.harness.certs import HostCert, group_certs
from tests.harness.wait import wait_until

TOKEN = "s3cret-token-0123456789abcdef"
LIMITS = Limits(max_connections=32, header_timeout=1.0, body_timeout=1.0, max_body_bytes=MAX_BODY)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def status(self) -> dict[str, Any]:
        self.calls.append("status")
        return {"ok": True}

    def start_worker(self, request: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append("start")
        return {"ok": True}

    def stop_worker(self, request: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append("stop")
        return {"ok": True}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, HostCert]:
    return group_certs(tmp_path_factory.mktemp("certs"), ["127.0.0.1", "10.9.9.9"])


@pytest.fixture
def served(certs: dict[str, HostCert]) -> Iterator[tuple[ClusterServer, Recorder]]:
    handler = Recorder()
    server = ClusterServer(("127.0.0.1", 0), TOKEN, handler, certs["127.0.0.1"].tls().server, LIMITS)
    server.start()
    yield server, handler
    server.close()


@contextlib.contextmanager
def tls_socket(server: ClusterServer, context: ssl.SSLContext) -> Iterator[ssl.SSLSocket]:
    raw = socket.create_connection(server.address, timeout=5)
    with context.wrap_socket(raw, server_hostname=server.address[0]) as wrapped:
        yield wrapped


def answer(sock: socket.socket) -> bytes:
    data = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def more_descriptors(count: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count), hard))


def test_a_peer_without_the_group_certificate_gets_no_further_than_the_handshake(
    served: tuple[ClusterServer, Recorder], certs: dict[str, HostCert], tmp_path: Path
) -> None:
    """No client certificate, or one of another CA: the handshake fails, the handler never runs."""
    server, handler = served
    no_cert = ssl.create_default_context(cafile=str(certs["127.0.0.1"].ca))
    stranger = group_certs(tmp_path / "other-group", ["127.0.0.1"])["127.0.0.1"]
    other_ca = ssl.create_default_context(cafile=str(certs["127.0.0.1"].ca))
    other_ca.load_cert_chain(str(stranger.cert), str(stranger.key))
    request = b"GET /v1/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n\r\n"
    refused = (ssl.SSLError, ConnectionResetError, BrokenPipeError)
    for context in (no_cert, other_ca):
        with pytest.raises(refused), tls_socket(server, context) as sock:
            sock.sendall(request)
            if not answer(sock):
                raise ConnectionResetError("closed without an answer")
    with pytest.raises(MemberUnreachable):
        ClusterClient(f"127.0.0.1:{server.address[1]}", TOKEN, stranger.tls().client).status()
    assert handler.calls == []


def test_the_client_checks_the_member_is_who_it_dialled(certs: dict[str, HostCert]) -> None:
    """A member whose certificate names another address is refused by the client (no token sent)."""
    handler = Recorder()
    impostor = ClusterServer(("127.0.0.1", 0), TOKEN, handler, certs["10.9.9.9"].tls().server, LIMITS)
    impostor.start()
    try:
        with pytest.raises(MemberUnreachable, match="certificate"):
            ClusterClient(f"127.0.0.1:{impostor.address[1]}", TOKEN, certs["127.0.0.1"].tls().client).status()
    finally:
        impostor.close()
    assert handler.calls == []


def test_plain_http_is_not_spoken(served: tuple[ClusterServer, Recorder]) -> None:
    """A cleartext request gets no HTTP answer (the token never crosses the network in clear)."""
    server, handler = served
    with socket.create_connection(server.address, timeout=5) as sock:
        sock.sendall(b"GET /v1/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n\r\n")
        assert not answer(sock).startswith(b"HTTP/")
    assert handler.calls == []


def test_half_sent_requests_are_capped_and_timed_out(
    served: tuple[ClusterServer, Recorder], certs: dict[str, HostCert]
) -> None:
    """1,021 connections from one peer that never finish a request: at most max_connections are held (and
    the few beyond them that would be answered 503), the rest closed at once (a connection is never
    closed for another before its grace, as it may carry the token); the held ones are closed after
    header_timeout and the API answers again."""
    server, handler = served
    more_descriptors(4096)
    attackers: list[socket.socket] = []
    try:
        for index in range(1021):
            sock = socket.create_connection(server.address, timeout=5)
            if index % 2:
                sock.sendall(b"\x16\x03\x01\x00")  # the start of a TLS record, never finished
            attackers.append(sock)
        held = LIMITS.max_connections + overflow(LIMITS)  # the slots, and those held to be answered 503
        wait_until(lambda: _turned_away(server) >= 1021 - held, 10, what="the connections beyond the slots closed")
        assert server.guarded.open_connections() <= held
        wait_until(
            lambda: server.guarded.open_connections() == 0,
            LIMITS.header_timeout + 3,
            0.1,
            what="half-sent connections to be timed out",
        )
        member = ClusterClient(f"127.0.0.1:{server.address[1]}", TOKEN, certs["127.0.0.1"].tls().client)
        assert member.status() == {"ok": True}
    finally:
        for sock in attackers:
            sock.close()
    assert handler.calls == ["status"]


def test_a_connection_that_sends_no_headers_after_the_handshake_is_closed(
    served: tuple[ClusterServer, Recorder], certs: dict[str, HostCert]
) -> None:
    """A peer with the group's certificate that then sends half a request is closed after header_timeout."""
    server, handler = served
    started = time.monotonic()
    with tls_socket(server, certs["127.0.0.1"].tls().client) as sock:
        sock.sendall(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n")
        assert answer(sock) == b""
    assert time.monotonic() - started < LIMITS.header_timeout + 2
    assert handler.calls == []


def request_with_token(server: ClusterServer, certs: HostCert, head: bytes, body: bytes = b"") -> bytes:
    with tls_socket(server, certs.tls().client) as sock:
        sock.sendall(
            b"POST /v1/start-worker HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n" + head
        )
        if body:
            with contextlib.suppress(OSError):
                sock.sendall(body)
        return answer(sock)


@pytest.mark.parametrize("length", [b"-1", b"abc", b"1e3", b"+5", b"5, 6"])
def test_a_bad_content_length_is_a_400_without_a_traceback(
    served: tuple[ClusterServer, Recorder],
    certs: dict[str, HostCert],
    caplog: pytest.LogCaptureFixture,
    length: bytes,
) -> None:
    """A Content-Length that is not a plain number: 400 from the parser, no handler call, no traceback."""
    server, handler = served
    reply = request_with_token(server, certs["127.0.0.1"], b"Content-Length: " + length + b"\r\n\r\n", b"{}")
    assert reply.split(b"\r\n")[0].endswith(b"400 Bad Request")
    assert handler.calls == []
    assert "Traceback" not in caplog.text
    assert all(record.exc_info is None for record in caplog.records)


def test_a_huge_declared_length_is_refused_before_reading(
    served: tuple[ClusterServer, Recorder], certs: dict[str, HostCert]
) -> None:
    """Content-Length: 400 MiB is a 413 at once, without waiting for (or reading) the body."""
    server, handler = served
    with tls_socket(server, certs["127.0.0.1"].tls().client) as sock:
        started = time.monotonic()
        sock.sendall(
            b"POST /v1/start-worker HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + TOKEN.encode()
            + b"\r\nContent-Length: 419430400\r\n\r\n"
        )
        reply = sock.recv(65536)
        answered = time.monotonic() - started
    assert reply.split(b"\r\n")[0].endswith(b"413 Request Entity Too Large")
    assert answered < LIMITS.body_timeout
    assert handler.calls == []


def test_a_chunked_body_is_counted_as_it_arrives(
    served: tuple[ClusterServer, Recorder], certs: dict[str, HostCert]
) -> None:
    """A chunked body beyond MAX_BODY is a 413 (no length declared, so the size is counted)."""
    server, handler = served
    chunk = b"x" * 16384
    body = (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * 16 + b"0\r\n\r\n"  # 256 KiB
    reply = request_with_token(server, certs["127.0.0.1"], b"Transfer-Encoding: chunked\r\n\r\n", body)
    assert reply.split(b"\r\n")[0].endswith(b"413 Request Entity Too Large")
    assert handler.calls == []


def test_a_slow_body_is_a_408(served: tuple[ClusterServer, Recorder], certs: dict[str, HostCert]) -> None:
    """A body that does not arrive within body_timeout: 408, the handler never runs."""
    server, handler = served
    with tls_socket(server, certs["127.0.0.1"].tls().client) as sock:
        sock.sendall(
            b"POST /v1/start-worker HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + TOKEN.encode()
            + b"\r\nContent-Length: 100\r\n\r\n{"
        )
        reply = answer(sock)
    assert reply.split(b"\r\n")[0].endswith(b"408 Request Timeout")
    assert handler.calls == []


def _turned_away(server: ClusterServer) -> int:
    """Connections the server closed without serving: refused at once, or evicted for another."""
    return server.guarded.refused + server.guarded.evicted


def test_file_descriptor_count_stays_bounded(
    served: tuple[ClusterServer, Recorder], certs: dict[str, HostCert]
) -> None:
    """While 1,021 attackers connect, this process's descriptors grow by theirs plus at most the cap."""
    server, _ = served
    more_descriptors(4096)
    before = len(os.listdir("/proc/self/fd"))
    attackers = [socket.create_connection(server.address, timeout=5) for _ in range(1021)]
    try:
        held = LIMITS.max_connections + overflow(LIMITS)
        wait_until(lambda: _turned_away(server) >= 1021 - held, 10, what="the connections beyond the slots closed")
        grown = len(os.listdir("/proc/self/fd")) - before - len(attackers)
        assert grown <= LIMITS.max_connections + 4
    finally:
        for sock in attackers:
            sock.close()
