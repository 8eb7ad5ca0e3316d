"""Reading a log file that another process appends to: the process runtime's own log of a
server, and the k8s-file log conmon writes for a container.

A follower sleeps until the file is written to or the writing process ends (ChangeWatch:
inotify and a pidfd, on Linux), so a quiet log costs no CPU and a new line reaches the
supervisor at once. Where those are unavailable it polls every FOLLOW_POLL_SECONDS. (Podman 4's
own follow stream polls every 250 ms; docs/podman-runtime.md says why that matters.)

Each line's time: conmon stores it in the k8s-file record (`k8s_file_timed_lines`); a process
server writes plain lines, whose times its watcher (`runtime.line_times`) writes beside them, one
per line (`line_time_record`, `read_line_times`, `timed_file_lines`): this module owns both forms.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from pathlib import Path

FOLLOW_POLL_SECONDS = 0.02
WATCH_RECHECK_SECONDS = 1.0
"""A watched follower still checks this often (a safety net; inotify does not miss writes)."""

_IN_MODIFY = 0x00000002
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100


def poll_briefly() -> None:
    time.sleep(FOLLOW_POLL_SECONDS)


def follow_file(
    path: Path, follow: bool, running: Callable[[], object], wait: Callable[[], object] = poll_briefly
) -> Iterator[bytes]:
    """The file's lines (without their newline) from the start; when following, each new line as
    it is written, until `running()` is false and the file is read to its end. `wait()` blocks
    until more may have been written. A last line without a newline comes last. A missing file
    gives nothing."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return
    with handle:
        pending = b""
        while True:
            chunk = handle.read(65536)
            if chunk:
                pending += chunk
                *complete, pending = pending.split(b"\n")
                yield from complete
                continue
            if not follow or not running():
                rest = handle.read()  # written between the empty read and the check
                if rest:
                    pending += rest
                    continue
                if pending:
                    yield pending
                return
            wait()


class ChangeWatch:
    """Wakes a follower when its log file is written, an entry appears in a directory, or a
    process ends: inotify on the file (and directory) plus a pidfd of the process, in one poll."""

    def __init__(self, inotify_fd: int, pid_fd: int) -> None:
        self._inotify_fd = inotify_fd
        self._pid_fd = pid_fd
        self._poll = select.poll()
        self._poll.register(inotify_fd, select.POLLIN)
        self._poll.register(pid_fd, select.POLLIN)

    @classmethod
    def open(cls, path: Path, pid: int, directory: Path | None = None) -> ChangeWatch | None:
        """A watch of `path` (and entries created in `directory`) and process `pid`; None where the
        system offers no inotify or pidfd (the follower then polls). The caller checks that `pid`
        is still its process after this returns: the pidfd holds on to whichever process had it."""
        inotify_fd = _inotify([(path, _IN_MODIFY)] + ([(directory, _IN_CREATE | _IN_MOVED_TO)] if directory else []))
        if inotify_fd is None:
            return None
        try:
            pid_fd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            os.close(inotify_fd)
            return None
        return cls(inotify_fd, pid_fd)

    def wait(self, timeout: float = WATCH_RECHECK_SECONDS) -> bool:
        """Block until the file was written, an entry appeared, the process ended (True), or the
        timeout passed (False)."""
        events = self._poll.poll(timeout * 1000)
        for fd, _ in events:
            if fd == self._inotify_fd:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self._inotify_fd, 65536):
                        pass
        return bool(events)

    def process_ended(self) -> bool:
        """The watched process has exited (its pidfd turned readable)."""
        readable, _, _ = select.select([self._pid_fd], [], [], 0)
        return bool(readable)

    def close(self) -> None:
        for fd in (self._inotify_fd, self._pid_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def _inotify(watches: Sequence[tuple[Path, int]]) -> int | None:
    """A non-blocking inotify descriptor watching each (path, mask); None where that fails."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = int(libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
    except (OSError, AttributeError):
        return None
    if fd < 0:
        return None
    for path, mask in watches:
        if libc.inotify_add_watch(fd, os.fsencode(path), mask) < 0:
            os.close(fd)
            return None
    return fd


def k8s_file_record(record: bytes) -> tuple[bytes, bytes, bool] | None:
    """(stream, message, partial) of one k8s-file record `TIMESTAMP STREAM F|P MESSAGE`; None if it is not one.

    conmon cuts output lines longer than its buffer into `P` (partial) records ended by an `F` one.
    """
    parsed = k8s_file_timed_record(record)
    return None if parsed is None else parsed[1:]


def k8s_file_timed_record(record: bytes) -> tuple[datetime | None, bytes, bytes, bool] | None:
    """(time, stream, message, partial) of one k8s-file record; the time is conmon's (RFC 3339 with
    nanoseconds, kept to microseconds), None when it does not parse."""
    parts = record.split(b" ", 3)
    if len(parts) < 3 or parts[2] not in (b"F", b"P"):
        return None
    try:
        at: datetime | None = datetime.fromisoformat(parts[0].decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        at = None
    return at, parts[1], parts[3] if len(parts) == 4 else b"", parts[2] == b"P"


def k8s_file_lines(records: Iterable[bytes]) -> Iterator[str]:
    """The container's output lines from k8s-file records, partial records joined per stream."""
    for _, line in k8s_file_timed_lines(records):
        yield line


def k8s_file_timed_lines(records: Iterable[bytes]) -> Iterator[tuple[datetime | None, str]]:
    """Each output line with the time conmon wrote its first part (partial records joined per stream)."""
    partial: dict[bytes, tuple[datetime | None, bytes]] = {}
    for record in records:
        parsed = k8s_file_timed_record(record)
        if parsed is None:
            continue
        at, stream, message, is_partial = parsed
        first_at, before = partial.pop(stream, (at, b""))
        if is_partial:
            partial[stream] = (first_at, before + message)
            continue
        yield first_at, _text(before + message)
    for at, rest in partial.values():
        yield at, _text(rest)


def _text(line: bytes) -> str:
    return line.decode("utf-8", "replace").rstrip("\r")


MAX_LINE_TIME = 32503680000.0
"""The latest line time read back (the year 3000): beyond it an entry is unknown, not an overflow."""


def line_time_record(at: float) -> bytes:
    """One entry of a process log's line times (`LINE_TIMES`): the Unix time its line began, to the microsecond."""
    return b"%.6f\n" % at


def read_line_times(path: Path, offset: int = 0) -> tuple[list[float | None], int]:
    """The line times written to `path` from `offset`, and the offset after the last complete entry (a missing
    file: none; an entry that is not a time is left unknown, so later lines keep their place)."""
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1
    times: list[float | None] = []
    for entry in data[:end].split(b"\n")[:-1]:
        try:
            at = float(entry)
        except ValueError:
            at = None
        # Only a time a datetime can hold (the file is outside input: nan, inf or 1e300 would raise later).
        times.append(at if at is not None and 0 <= at <= MAX_LINE_TIME else None)
    return times, offset + end


def timed_file_lines(
    lines: Iterable[str], times: Callable[[int], float | None]
) -> Iterator[tuple[datetime | None, str]]:
    """A process log's lines (as `follow_file` cuts them) with the time the line-times file holds for each
    (`times(i)` of the i-th line; None where it has none)."""
    for index, line in enumerate(lines):
        at = times(index)
        yield (None if at is None else datetime.fromtimestamp(at).astimezone()), line
