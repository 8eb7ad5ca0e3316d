"""Which connections make room for a new one (aioserver.room_for)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from dankserve.aioserver import Connection, Limits, room_for

LIMITS = Limits(max_connections=4, header_timeout=1.0, body_timeout=1.0, max_body_bytes=1, max_untrusted_per_peer=2)


@pytest.fixture
def sock() -> Iterator[socket.socket]:
    with socket.socket() as s:
        yield s


def conn(sock: socket.socket, peer: str, at: float, *, trusted: bool = False, busy: int = 0) -> Connection:
    return Connection(sock, at, peer=peer, accepted_at=at, trusted=trusted, busy=busy)


def test_a_peer_at_its_cap_makes_room_with_its_own_oldest_idle_connection(sock: socket.socket) -> None:
    """The peer's oldest idle unauthenticated connection is closed; others' are untouched."""
    a1, a2, b1 = conn(sock, "a", 1), conn(sock, "a", 2), conn(sock, "b", 0)
    assert room_for([b1, a1, a2], "a", LIMITS) == (True, [a1])
    assert room_for([b1, a1, a2], "c", LIMITS) == (True, [])


def test_authenticated_and_busy_connections_are_never_closed_for_a_newcomer(sock: socket.socket) -> None:
    """All slots trusted or busy: the newcomer is refused; a peer's trusted ones do not count against its cap."""
    full = [conn(sock, "a", 1, trusted=True), conn(sock, "a", 2, trusted=True), conn(sock, "b", 3, busy=1)]
    assert room_for(full, "a", LIMITS) == (True, [])
    assert room_for([*full, conn(sock, "c", 4, busy=1)], "a", LIMITS) == (False, [])


def test_all_slots_taken_closes_the_oldest_idle_unauthenticated_of_anyone(sock: socket.socket) -> None:
    """A full server closes the oldest idle unauthenticated connection, whoever's, for the newcomer."""
    old_b, c, t = conn(sock, "b", 1), conn(sock, "c", 2), conn(sock, "d", 0, trusted=True)
    assert room_for([t, old_b, c, conn(sock, "e", 3)], "a", LIMITS) == (True, [old_b])
