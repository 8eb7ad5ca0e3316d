"""journald's native protocol, as a structlog sink: entries with fields (DEPLOYMENT=, PHASE= ...).

A datagram to /run/systemd/journal/socket holds the entry's fields: `KEY=value\\n` for plain
values; a value holding a newline is sent as `KEY\\n`, its length as 64-bit little-endian, the
bytes, `\\n`. An entry too large for one datagram (EMSGSIZE) goes through a sealed memfd whose
descriptor is passed with SCM_RIGHTS in an empty datagram, as systemd's own sd_journal_send
does. Nothing is truncated.

Use with structlog: `journal_fields` as the last processor, `JournalLoggerFactory` as the
logger factory. Event keys become upper-cased fields (`deployment` -> `DEPLOYMENT`);
`event` is MESSAGE, the level is PRIORITY, SYSLOG_IDENTIFIER is `dankserve`. A daemon's logger
also stamps its identity on every entry (DANKSERVE_STATE_DIR=, daemon_identity), so `dankserve logs`
shows this daemon's entries and not those of another one writing to the same journal.
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import json
import os
import re
import socket
import struct
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any, TextIO

JOURNAL_SOCKET = "/run/systemd/journal/socket"
SYSLOG_IDENTIFIER = "dankserve"
STATE_DIR_FIELD = "DANKSERVE_STATE_DIR"
"""Names the daemon an entry comes from: one state dir is one daemon (its instance lock)."""

# syslog priorities by structlog method / level name
PRIORITIES: dict[str, int] = {
    "critical": 2,
    "fatal": 2,
    "exception": 3,
    "error": 3,
    "failure": 3,
    "warning": 4,
    "warn": 4,
    "notice": 5,
    "info": 6,
    "msg": 6,
    "log": 6,
    "debug": 7,
}

_INVALID = re.compile(r"[^A-Z0-9_]")
# Fields we set ourselves, and event keys structlog adds that journald stamps on its own.
_OWN_KEYS = frozenset({"event", "level", "timestamp", "exception", "exc_info", "stack"})
MAX_FIELD_NAME = 64


def field_name(key: str) -> str | None:
    """A journal field name for an event key: upper case, [A-Z0-9_], not starting with _ or a digit."""
    name = _INVALID.sub("_", key.upper()).lstrip("_0123456789")[:MAX_FIELD_NAME]
    return name or None


def field_value(value: Any) -> str:
    """A field value as text: strings as they are, containers as JSON, anything else str()."""
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str)
    return str(value)


def encode_entry(fields: Mapping[str, str]) -> bytes:
    """The native-protocol datagram of one entry."""
    parts = []
    for key, value in fields.items():
        data = value.encode("utf-8", errors="replace")
        if b"\n" in data:
            parts.append(key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n")
        else:
            parts.append(key.encode() + b"=" + data + b"\n")
    return b"".join(parts)


class JournalSender:
    """Sends entries to journald's socket; falls back to a stream (stderr) when journald is gone."""

    def __init__(self, socket_path: str = JOURNAL_SOCKET, fallback: TextIO | None = None) -> None:
        self.socket_path = socket_path
        self._fallback = fallback
        self._socket: socket.socket | None = None

    def send(self, fields: Mapping[str, str]) -> bool:
        """Write one entry; False when journald did not take it (then the fallback stream got it)."""
        data = encode_entry(fields)
        try:
            if self._socket is None:
                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            try:
                self._socket.sendto(data, self.socket_path)
            except OSError as exc:
                if exc.errno not in (errno.EMSGSIZE, errno.ENOBUFS):
                    raise
                self._send_large(data)
        except OSError as exc:
            self._fall_back(fields, exc)
            return False
        return True

    def _send_large(self, data: bytes) -> None:
        # systemd's sd_journal_sendv: a sealed memfd passed in an otherwise empty datagram.
        assert self._socket is not None
        fd = os.memfd_create("dankserve-journal", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            fcntl.fcntl(
                fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
            )
            rights = array.array("i", [fd])
            self._socket.sendmsg([], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)], 0, self.socket_path)
        finally:
            os.close(fd)

    def _fall_back(self, fields: Mapping[str, str], exc: OSError) -> None:
        stream = self._fallback if self._fallback is not None else sys.stderr
        extra = " ".join(f"{k.lower()}={v}" for k, v in fields.items() if k not in ("MESSAGE", "PRIORITY"))
        with contextlib.suppress(OSError, ValueError):
            stream.write(f"{fields.get('MESSAGE', '')} {extra} (journald unreachable: {exc.strerror or exc})\n")
            stream.flush()

    def close(self) -> None:
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.close()
            self._socket = None


def journal_fields(logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> dict[str, str]:
    """structlog's last processor: the event as journal fields (passed to JournalLogger as keywords)."""
    level = str(event_dict.get("level", method_name)).lower()
    message = field_value(event_dict.get("event", ""))
    trace = event_dict.get("exception") or event_dict.get("stack")
    if trace:
        message = f"{message}\n{trace}"
    fields = {
        "MESSAGE": message,
        "PRIORITY": str(PRIORITIES.get(level, 6)),
        "SYSLOG_IDENTIFIER": SYSLOG_IDENTIFIER,
    }
    for key, value in event_dict.items():
        if key in _OWN_KEYS or value is None:
            continue
        name = field_name(key)
        if name is not None and name not in fields:
            fields[name] = field_value(value)
    return fields


def daemon_identity(state_dir: Path) -> dict[str, str]:
    """The fields naming one daemon on each of its entries, and what `dankserve logs` matches on."""
    return {STATE_DIR_FIELD: str(state_dir.absolute())}


class JournalLogger:
    """A structlog logger whose every method sends the keyword fields (and the constant ones) as one entry."""

    def __init__(self, sender: JournalSender, constant: Mapping[str, str] | None = None) -> None:
        self._sender = sender
        self._constant = dict(constant or {})

    def msg(self, **fields: str) -> None:
        self._sender.send({**fields, **self._constant})

    log = debug = info = notice = warning = warn = error = critical = fatal = exception = failure = msg


class JournalLoggerFactory:
    """structlog logger factory: every logger shares one sender (one socket) and the constant fields
    (the daemon's identity)."""

    def __init__(self, socket_path: str = JOURNAL_SOCKET, constant: Mapping[str, str] | None = None) -> None:
        self.sender = JournalSender(socket_path)
        self.constant = dict(constant or {})

    def __call__(self, *args: Any) -> JournalLogger:
        return JournalLogger(self.sender, self.constant)


def journal_reachable(socket_path: str = JOURNAL_SOCKET) -> bool:
    """Whether a journald listens on the socket (a file left by a stopped journald does not count)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as probe:
            probe.connect(socket_path)
    except OSError:
        return False
    return True
