"""sd_notify without libsystemd: datagrams to `$NOTIFY_SOCKET` (a leading `@` is abstract).

The protocol (systemd's sd_notify(3)): newline-separated `KEY=VALUE` assignments in one
datagram. Without NOTIFY_SOCKET (not started by systemd with Type=notify) every call is a
no-op returning False; a failed send also returns False: notifying must never stop the daemon.

Sends never block (MSG_DONTWAIT): when the socket's queue is full (a PID 1 that stopped reading
it), a blocking send would freeze the daemon's main loop, and with it reloads and stops. A
datagram that finds the queue full is dropped; its state-changing assignments (READY, STOPPING,
STATUS, ...: all but WATCHDOG, whose next ping comes anyway) go out again with the next send.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Mapping


def _address(value: str | None) -> str | None:
    if not value:
        return None
    if value.startswith("@"):
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None  # vsock: and other forms are not for a system service on one host


class SystemdNotifier:
    """Sends notifications to one NOTIFY_SOCKET; keeps its socket open between sends."""

    def __init__(self, notify_socket: str | None) -> None:
        self._address = _address(notify_socket)
        self._socket: socket.socket | None = None
        self._dropped: dict[str, str] = {}
        """Assignments of datagrams the full queue refused, sent again with the next one."""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> SystemdNotifier:
        """The notifier of this process ($NOTIFY_SOCKET)."""
        env = os.environ if environ is None else environ
        return cls(env.get("NOTIFY_SOCKET"))

    @property
    def enabled(self) -> bool:
        """Whether there is a socket to notify (the service runs under systemd with Type=notify)."""
        return self._address is not None

    def notify(self, **assignments: str | int) -> bool:
        """Send `KEY=VALUE` assignments in one datagram; False when disabled or the send failed."""
        if self._address is None:
            return False
        merged = {**self._dropped, **{key: str(value) for key, value in assignments.items()}}
        payload = "\n".join(f"{key}={value}" for key, value in merged.items()).encode()
        try:
            if self._socket is None:
                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._socket.sendto(payload, socket.MSG_DONTWAIT, self._address)
        except BlockingIOError:  # the queue is full: drop it, never wait for the reader
            self._dropped = {key: value for key, value in merged.items() if key != "WATCHDOG"}
            return False
        except OSError:
            self.close()
            return False
        self._dropped = {}
        return True

    def resend_dropped(self) -> bool:
        """Send again what a full queue dropped (READY, STATUS ...) if anything; True when nothing waits now.
        The daemon calls it every turn of its main loop, so a dropped READY=1 arrives once the reader drains."""
        if not self._dropped:
            return True
        return self.notify()

    def ready(self, status: str | None = None) -> bool:
        """READY=1 (with a STATUS= line when given)."""
        if status is None:
            return self.notify(READY=1)
        return self.notify(READY=1, STATUS=_one_line(status))

    def status(self, text: str) -> bool:
        """STATUS=text, shown by `systemctl status`."""
        return self.notify(STATUS=_one_line(text))

    def extend_timeout(self, usec: int) -> bool:
        """EXTEND_TIMEOUT_USEC: the start (or stop) may take `usec` more from now."""
        return self.notify(EXTEND_TIMEOUT_USEC=int(usec))

    def watchdog(self) -> bool:
        """WATCHDOG=1: the service is alive."""
        return self.notify(WATCHDOG=1)

    def stopping(self, status: str | None = None) -> bool:
        """STOPPING=1: the service is shutting down."""
        if status is None:
            return self.notify(STOPPING=1)
        return self.notify(STOPPING=1, STATUS=_one_line(status))

    def close(self) -> None:
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.close()
            self._socket = None


def _one_line(text: str) -> str:
    # A newline would start a new assignment in the datagram.
    return " ".join(text.splitlines())


def watchdog_interval(environ: Mapping[str, str] | None = None, pid: int | None = None) -> float | None:
    """Seconds between WATCHDOG=1 pings (half of WATCHDOG_USEC), or None when no watchdog is set
    for this process (WATCHDOG_PID names another one, or the values are not numbers)."""
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC")
    if not usec:
        return None
    owner = env.get("WATCHDOG_PID")
    try:
        if owner and int(owner) != (os.getpid() if pid is None else pid):
            return None
        value = int(usec)
    except ValueError:
        return None
    if value <= 0:
        return None
    return value / 2 / 1_000_000
