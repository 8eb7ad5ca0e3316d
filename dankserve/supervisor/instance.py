"""One daemon per host: an exclusive lock in the state directory, and its pid file.

The lock is an fcntl lock, so it dies with the process, even one killed with -9: a stale pid
file never blocks a new daemon, and `running_daemon` never reports a dead one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from dankserve.errors import EnvironmentUnusable

LOCK_NAME = "daemon.lock"
PID_NAME = "daemon.pid"


def use_private_umask() -> None:
    """Files and dirs the daemon (and a process-runtime server) creates: owner only (0600/0700).

    The unit sets UMask=0077; this does the same for a daemon started by `dankserve up`."""
    os.umask(0o077)


def ensure_private_dir(path: Path) -> Path:
    """Create `path` (0700) if needed; refuse nothing, but tighten a dir we created."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except PermissionError:
        raise EnvironmentUnusable(
            f"cannot create {path}: permission denied",
            fix="run as root (sudo), or set state_dir and cache_dir to directories you own",
        ) from None
    return path


@dataclass
class DaemonLock:
    """The held lock; release() or process exit frees it."""

    fd: int
    pid_path: Path

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.pid_path.unlink()
        with contextlib.suppress(OSError):
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)


def acquire(state_dir: Path) -> DaemonLock:
    """Take the one-daemon lock or fail naming the daemon that holds it.

    The lock file is opened read-only (flock needs no write access): an open writable file
    would keep the state dir's file system from being remounted read-only, and the daemon
    must keep running when that happens. A state dir the daemon cannot use at start is an
    environment error (exit 3), never a traceback.
    """
    try:
        ensure_private_dir(state_dir)
        fd = os.open(state_dir / LOCK_NAME, os.O_RDONLY | os.O_CREAT, 0o600)
    except OSError as exc:
        raise _unusable(state_dir, exc) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        pid = read_pid(state_dir)
        raise EnvironmentUnusable(
            f"another dankserve daemon is running (pid {pid if pid else 'unknown'}, state dir {state_dir})",
            fix="use `dankserve status`, or `dankserve down` to stop it first",
        ) from None
    pid_path = state_dir / PID_NAME
    tmp = pid_path.with_suffix(".tmp")
    try:
        tmp.write_text(f"{os.getpid()}\n")
        os.chmod(tmp, 0o600)
        tmp.replace(pid_path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        os.close(fd)
        raise _unusable(state_dir, exc) from None
    return DaemonLock(fd, pid_path)


def _unusable(state_dir: Path, exc: OSError) -> EnvironmentUnusable:
    return EnvironmentUnusable(
        f"the state dir {state_dir} cannot be used: {exc.strerror or exc}",
        fix="make it a writable directory with free space (the state_dir setting or DANKSERVE_STATE_DIR names it)",
    )


def read_pid(state_dir: Path) -> int | None:
    """The pid in the pid file, if any."""
    try:
        return int((state_dir / PID_NAME).read_text().strip())
    except (OSError, ValueError):
        return None


def running_daemon(state_dir: Path) -> int | None:
    """The pid of the daemon holding the lock, or None when no daemon runs."""
    lock_path = state_dir / LOCK_NAME
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return read_pid(state_dir) or -1
    finally:
        os.close(fd)
    return None
