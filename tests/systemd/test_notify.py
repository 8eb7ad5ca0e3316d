"""Tests for dankserve.systemd.notify: sd_notify over real datagram sockets (path and abstract)."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dankserve.systemd.notify import SystemdNotifier, watchdog_interval


@pytest.fixture
def path_socket(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """A datagram socket bound in tmp_path, as systemd's NOTIFY_SOCKET would be."""
    path = tmp_path / "notify"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(str(path))
    receiver.settimeout(5)
    yield str(path), receiver
    receiver.close()


@pytest.fixture
def abstract_socket() -> Iterator[tuple[str, socket.socket]]:
    """A datagram socket in the abstract namespace; NOTIFY_SOCKET names it with a leading @."""
    name = f"dankserve-test-{uuid.uuid4().hex}"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind("\0" + name)
    receiver.settimeout(5)
    yield "@" + name, receiver
    receiver.close()


def test_ready_over_path_socket(path_socket: tuple[str, socket.socket]) -> None:
    """READY=1 arrives as one datagram on a socket file."""
    address, receiver = path_socket
    notifier = SystemdNotifier.from_environ({"NOTIFY_SOCKET": address})
    assert notifier.enabled and notifier.ready()
    assert receiver.recv(4096) == b"READY=1"


def test_every_helper_over_abstract_socket(abstract_socket: tuple[str, socket.socket]) -> None:
    """Each helper's assignments arrive on an abstract socket (leading @)."""
    address, receiver = abstract_socket
    notifier = SystemdNotifier(address)
    assert notifier.status("chat: loading 42 %")
    assert notifier.extend_timeout(90_000_000)
    assert notifier.watchdog()
    assert notifier.ready(status="all deployments ready")
    assert notifier.stopping()
    received = [receiver.recv(4096) for _ in range(5)]
    assert received == [
        b"STATUS=chat: loading 42 %",
        b"EXTEND_TIMEOUT_USEC=90000000",
        b"WATCHDOG=1",
        b"READY=1\nSTATUS=all deployments ready",
        b"STOPPING=1",
    ]


def test_status_stays_one_line(path_socket: tuple[str, socket.socket]) -> None:
    """A multi-line status is flattened: a newline would start a new assignment."""
    address, receiver = path_socket
    SystemdNotifier(address).status("chat: failed\nREADY=1")
    assert receiver.recv(4096) == b"STATUS=chat: failed READY=1"


def test_no_socket_is_a_no_op() -> None:
    """Without NOTIFY_SOCKET every call does nothing and says so."""
    notifier = SystemdNotifier.from_environ({})
    assert not notifier.enabled
    assert not notifier.ready() and not notifier.watchdog() and not notifier.stopping()


def test_vanished_socket_is_not_an_error(tmp_path: Path) -> None:
    """A NOTIFY_SOCKET nobody listens on makes the call return False, not raise."""
    assert not SystemdNotifier(str(tmp_path / "gone")).ready()


@pytest.mark.parametrize(
    ("environ", "interval"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
    ],
)
def test_watchdog_interval(environ: dict[str, str], interval: float | None) -> None:
    """Pings are due at half of WATCHDOG_USEC, only when the watchdog is for this process."""
    assert watchdog_interval(environ) == interval


def fill(address: str) -> int:
    """Fill the receiver's queue from another socket until the kernel refuses more (a reader that stopped)."""
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sent = 0
    try:
        while True:
            sender.sendto(b"STATUS=filler", socket.MSG_DONTWAIT, address)
            sent += 1
    except BlockingIOError:
        return sent
    finally:
        sender.close()


def test_a_full_queue_drops_the_datagram_without_blocking_and_resends_its_state_later(
    path_socket: tuple[str, socket.socket],
) -> None:
    """Issue 39.15: the reader stopped draining and its queue is full: a send returns False at once instead of
    blocking the caller (the daemon's main loop); once the reader drains, the next send carries the dropped
    READY=1 with it, and a dropped WATCHDOG=1 is not repeated."""
    address, receiver = path_socket
    filled = fill(address)
    assert filled > 0
    notifier = SystemdNotifier(address)
    results: list[bool] = []
    sender = threading.Thread(target=lambda: results.extend([notifier.ready(), notifier.watchdog()]), daemon=True)
    sender.start()
    sender.join(30)
    assert not sender.is_alive(), "sd_notify blocked on a full queue"
    assert results == [False, False]
    assert notifier.resend_dropped() is False  # still full: dropped again, never blocking
    for _ in range(filled):
        assert receiver.recv(4096) == b"STATUS=filler"
    assert notifier.resend_dropped()  # the main loop's next turn: READY=1 arrives once the reader drained
    assert receiver.recv(4096) == b"READY=1"
    assert notifier.resend_dropped()  # nothing waits
    assert notifier.status("serving")
    assert receiver.recv(4096) == b"STATUS=serving"
    assert notifier.watchdog()
    assert receiver.recv(4096) == b"WATCHDOG=1"
