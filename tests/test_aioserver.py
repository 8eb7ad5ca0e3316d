"""Which connections make room for a new one (aioserver.room_for): only ever idle ones proven keyless,
silent past the grace, or (when every slot is taken) kept alive after a vouched-for request."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Iterator

import pytest

from dankserve.aioserver import Connection, Limits, room_for

LIMITS = Limits(max_connections=4, header_timeout=10.0, body_timeout=1.0, max_body_bytes=1, max_untrusted_per_peer=2)
NOW = 100.0


@pytest.fixture
def sock() -> Iterator[socket.socket]:
    with socket.socket() as s:
        yield s


def conn(
    sock: socket.socket, peer: str, at: float, *, trusted: bool = False, refused: bool = False, busy: int = 0
) -> Connection:
    return Connection(sock, at, peer=peer, accepted_at=at, trusted=trusted, refused=refused, busy=busy)


def test_a_peer_at_its_cap_of_refused_connections_makes_room_with_its_oldest(sock: socket.socket) -> None:
    """The peer's oldest idle refused connection is closed; others' are untouched."""
    a1, a2, b1 = conn(sock, "a", 99, refused=True), conn(sock, "a", 99.5, refused=True), conn(sock, "b", 0)
    assert room_for([b1, a2, a1], "a", LIMITS, NOW) == (True, [a1])
    assert room_for([b1, a1, a2], "c", LIMITS, NOW) == (True, [])


def test_connections_just_accepted_are_never_closed_for_a_burst_of_the_same_peer(sock: socket.socket) -> None:
    """A burst: 5 connections of one peer within the grace, no request read yet: the 6th gets in and none
    closes (they may carry keys); a server full of such connections refuses the next rather than guess."""
    roomy = dataclasses.replace(LIMITS, max_connections=8)
    burst = [conn(sock, "a", NOW - 0.1 * i) for i in range(5)]
    assert room_for(burst, "a", roomy, NOW) == (True, [])
    assert room_for([*burst, *burst[:3]], "b", roomy, NOW) == (False, [])


def test_silent_past_the_grace_counts_as_suspect(sock: socket.socket) -> None:
    """A connection that sent nothing for longer than the grace is closed like a refused one."""
    silent, fresh = conn(sock, "a", NOW - 5), conn(sock, "a", NOW - 0.5)
    assert room_for([silent, fresh], "a", LIMITS, NOW) == (True, [])
    assert room_for([silent, conn(sock, "a", NOW - 3), fresh], "a", LIMITS, NOW) == (True, [silent])


def test_busy_connections_are_never_closed_and_trusted_idle_ones_go_last(sock: socket.socket) -> None:
    """All slots taken: a refused one of anyone goes first, then the longest idle trusted one; all busy: refused."""
    trusted_old = Connection(sock, 10, peer="t", accepted_at=0, trusted=True)
    trusted_new = Connection(sock, 50, peer="t", accepted_at=0, trusted=True)
    refused = conn(sock, "b", 1, refused=True)
    busy = conn(sock, "c", 2, busy=1)
    assert room_for([trusted_new, trusted_old, refused, busy], "a", LIMITS, NOW) == (True, [refused])
    assert room_for([trusted_new, trusted_old, busy, busy], "a", LIMITS, NOW) == (True, [trusted_old])
    in_progress = [conn(sock, p, 1, trusted=True, busy=1) for p in "wxyz"]
    assert room_for(in_progress, "a", LIMITS, NOW) == (False, [])


def test_a_peer_flooding_with_silent_connections_leaves_a_quarter_of_the_slots_to_others(sock: socket.socket) -> None:
    """With its cap (2) of connections yet to send a request, a peer gets no more once 3 of 4 slots are
    taken; another peer still gets in."""
    silent = [conn(sock, "a", NOW - 0.1), conn(sock, "a", NOW - 0.2)]
    assert room_for(silent, "a", LIMITS, NOW) == (True, [])
    three = [*silent, conn(sock, "a", NOW - 0.3)]
    assert room_for(three, "a", LIMITS, NOW) == (False, [])
    assert room_for(three, "b", LIMITS, NOW) == (True, [])
