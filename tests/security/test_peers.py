"""Security: a peer that never authenticates cannot starve those that do (issue 26, finding 5).

The attacker is another host (a network namespace on a bridge with this one, tests/harness/netns.py)
that keeps 40 connections open to the gateway or the cluster API, reopening each one closed: idle,
keyless requests, half a TLS hello. Meanwhile an authenticated caller on this host makes 20 calls;
every one is answered. Before the per-peer cap the attacker held every slot (max_connections 16).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dankserve.aioserver import Limits
from dankserve.cluster.api import MAX_BODY, ClusterClient, ClusterServer
from tests.harness import netns
from tests.harness.certs import group_certs
from tests.harness.daemon import free_port, process_deployment, running_daemon
from tests.harness.wait import hold_for

pytestmark = [pytest.mark.slow, pytest.mark.skipif(netns.available() is not None, reason=str(netns.available()))]

SLOTS = 16
ATTACKERS = 40
CALLS = 20

HOLD = """
import select, socket, sys, time
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seconds, payload = float(sys.argv[4]), bytes.fromhex(sys.argv[5])
deadline = time.monotonic() + seconds
held, opened, announced = [], 0, False
while time.monotonic() < deadline:
    alive = []
    for sock in held:
        if select.select([sock], [], [], 0)[0]:
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                sock.close()
                continue
        alive.append(sock)
    held = alive
    while len(held) < count and time.monotonic() < deadline:
        try:
            sock = socket.create_connection((host, port), timeout=1)
        except OSError:
            break
        if opened % 2:
            sock.sendall(payload)
        held.append(sock)
        opened += 1
    if not announced:  # the first round opened all it could: the slots are taken
        print("started", flush=True)
        announced = True
    time.sleep(0.02)
print(opened, flush=True)
"""
"""Keeps `count` connections to host:port open for `seconds`, every other one sending `payload` first."""


@pytest.fixture
def neighbour() -> Iterator[netns.Lab]:
    lab = netns.Lab.create(1)
    try:
        yield lab
    finally:
        lab.close()


@contextlib.contextmanager
def attacking(lab: netns.Lab, address: str, port: int, payload: bytes, seconds: float) -> Iterator[None]:
    """The neighbour holds ATTACKERS connections to address:port while the block runs (at most `seconds`)."""
    argv = [sys.executable, "-c", HOLD, address, str(port), str(ATTACKERS), str(seconds), payload.hex()]
    proc = subprocess.Popen(lab.hosts[0].command(argv), stdout=subprocess.PIPE, text=True)
    try:
        # the child says "started" once its first round has opened all the connections it could
        assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
        yield
    finally:
        proc.kill()
        proc.wait(10)


def calls_answered(call: Any) -> int:
    """How many of CALLS calls (a fresh connection each, 0.1 s apart) were answered."""
    answered = 0
    for _ in range(CALLS):
        with contextlib.suppress(Exception):
            if call():
                answered += 1
        hold_for(0.1, "the calls spread over the attack, 0.1 s apart")
    return answered


def test_a_keyless_neighbour_cannot_starve_the_gateway(tmp_path: Path, neighbour: netns.Lab) -> None:
    """A neighbour holding 40 connections (idle, or after a keyless request) leaves room for keyed clients."""
    key = tmp_path / "gateway.key"
    key.write_text("gateway-key-0123456789\n")
    key.chmod(0o600)
    port = free_port()
    gateway = {"listen": f"0.0.0.0:{port}", "api_key_file": str(key), "max_connections": SLOTS}
    with running_daemon(
        tmp_path, {"chat": process_deployment(free_port())}, extra_globals={"gateway": gateway}
    ) as daemon:
        daemon.wait_for("chat", lambda d: d["state"] == "ready")
        keyless = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
        headers = {"Authorization": "Bearer gateway-key-0123456789"}

        def models() -> bool:
            reply = httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=headers, timeout=3)
            return reply.status_code == 200

        with attacking(neighbour, f"{neighbour.prefix}1", port, keyless, seconds=30):
            assert calls_answered(models) == CALLS, daemon.log_tail()


def test_a_neighbour_without_a_certificate_cannot_starve_the_cluster_api(tmp_path: Path, neighbour: netns.Lab) -> None:
    """A neighbour holding 40 connections (idle, or half a TLS hello) leaves room for the group's members."""
    address = f"{neighbour.prefix}1"
    certs = group_certs(tmp_path / "certs", [address])[address]
    token = "group-token-0123456789abcdef0123"
    limits = Limits(max_connections=SLOTS, header_timeout=5.0, body_timeout=5.0, max_body_bytes=MAX_BODY)

    class Handler:
        def status(self) -> dict[str, Any]:
            return {"ok": True}

        def start_worker(self, request: Any) -> dict[str, Any]:
            return {"ok": False}

        def stop_worker(self, request: Any) -> dict[str, Any]:
            return {"ok": False}

    server = ClusterServer((address, 0), token, Handler(), certs.tls().server, limits)
    server.start()
    try:
        member = ClusterClient(f"{address}:{server.address[1]}", token, certs.tls().client)
        with attacking(neighbour, address, server.address[1], b"\x16\x03\x01\x00", seconds=30):
            assert calls_answered(lambda: member.status() == {"ok": True}) == CALLS
    finally:
        server.close()
