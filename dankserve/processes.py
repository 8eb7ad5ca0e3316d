"""Processes dankserve starts and finds again: one detached spawn, one identity check, private records.

The vLLM process runtime, the background daemon (`servicectl`) and Ray nodes all start a child in
its own session with its output in a 0600 log file, and remember it by pid *and* start time: a
pid alone may have been reused by an unrelated process after a reboot or a long time.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

START_TIME_TOLERANCE_SECONDS = 0.5
"""psutil's create_time is rounded differently on different reads; a reused pid starts far later."""


def spawn_detached(
    argv: Sequence[str],
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    append: bool = False,
    stdin: int | None = None,
) -> subprocess.Popen[bytes]:
    """Start `argv` in a new session (no terminal; its own process group), stdout and stderr to
    `log_path` (0600; appended to, or truncated), stdin from /dev/null (or the descriptor `stdin`,
    e.g. a start gate's pipe). OSError when it cannot run."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if append else os.O_TRUNC)  # never through a link
    fd = os.open(log_path, flags, 0o600)
    try:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL if stdin is None else stdin,
            stdout=fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=None if env is None else dict(env),
            close_fds=True,
        )
    finally:
        os.close(fd)


def start_time_of(pid: int) -> float:
    """When the process started (Unix time); now when it is already gone."""
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return time.time()


def start_ticks_of(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (/proc/PID/stat field 22); None when gone.

    Exact, unlike `start_time_of` (whose boot time each reader rounds): two processes given one pid a moment
    apart (a restored tree's pid taken again within the tolerance) differ here. Only meaningful within one
    boot, so it is checked beside the start time, not instead of it. A /proc that cannot be read for another
    reason (the daemon out of descriptors) raises, as psutil does: not a sign that the process ended."""
    try:
        fields = _read_stat(pid)
    except (FileNotFoundError, ProcessLookupError):
        return None
    with contextlib.suppress(IndexError, ValueError):
        return int(fields[19])
    return None


def is_same_process(pid: int, start_time: float, tolerance: float = START_TIME_TOLERANCE_SECONDS) -> bool:
    """The process `pid` that started at `start_time` still runs (not a zombie, not a reused pid)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - start_time) < tolerance and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def write_private_file(path: Path, text: str) -> None:
    """Replace `path` atomically (temp file, rename) with `text`, readable by its owner only (0600).

    For small records (process records, Ray node records, the image-version cache); the state file
    itself goes through `StateStore.save`, which also fsyncs."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:  # mkstemp: mode 0600
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# Orphans: a server's processes outlive their parent (a kill -9, CRIU's dump) and would go to pid 1, whose reaping
# a restore then waits for (its pids must be free: docs/snapshots.md "Host pids"). Some inits reap late or never
# (seen here: a sandbox's init took 2-10 s). As the child subreaper of what it starts, the daemon gets them and
# reaps them itself, only those of a server's process group that are not the server (no one else waits for them;
# a `subprocess` child is never taken from its waiter).
_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper(on: bool = True) -> bool:
    """Orphans of this process's descendants come to it (Linux prctl), or no longer (`on=False`); False where
    refused."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        return int(ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)) == 0
    return False


def _read_stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (the state first); raises OSError."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def _stat_fields(pid: int) -> list[str]:
    with contextlib.suppress(OSError):
        return _read_stat(pid)
    return []


def gone_or_zombie(pid: int) -> bool:
    """No process `pid` runs: none, or one that has exited and awaits its parent's wait (its pid still taken)."""
    fields = _stat_fields(pid)
    return not fields or fields[0] in ("Z", "X")


def reap_group_orphans(group: int) -> int:
    """Reaps this process's zombie children of process group `group` other than its leader (a server's orphaned
    workers, adopted as subreaper); how many."""
    reaped = 0
    for task in Path(f"/proc/{os.getpid()}/task").iterdir() if Path(f"/proc/{os.getpid()}/task").is_dir() else ():
        with contextlib.suppress(OSError, ValueError):
            for pid in (int(p) for p in (task / "children").read_text().split()):
                fields = _stat_fields(pid)
                if pid != group and len(fields) > 2 and fields[0] == "Z" and int(fields[2]) == group:
                    with contextlib.suppress(ChildProcessError, OSError):
                        os.waitpid(pid, os.WNOHANG)
                        reaped += 1
    return reaped
