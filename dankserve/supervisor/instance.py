"""One daemon per host: an exclusive lock in the state directory, and its pid file.

The lock is an fcntl lock, so it dies with the process, even one killed with -9: a stale pid
file never blocks a new daemon, and `running_daemon` never reports a dead one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from dankserve.errors import EnvironmentUnusable

LOCK_NAME = "daemon.lock"
PID_NAME = "daemon.pid"


def use_private_umask() -> None:
    """Files and dirs the daemon (and a process-runtime server) creates: owner only (0600/0700).

    The unit sets UMask=0077; this does the same for a daemon started by `dankserve up`."""
    os.umask(0o077)


def private_dir_problem(mode: int, owner: int, me: int) -> str | None:
    """Why a directory the daemon keeps its own files in is not its own, or None when it is."""
    if owner != me:
        return f"is owned by uid {owner}, not by the user the daemon runs as (uid {me})"
    if mode & 0o022:
        who = " and ".join(w for bit, w in ((0o020, "its group"), (0o002, "others")) if mode & bit)
        return f"is writable by {who} (mode {stat.S_IMODE(mode):04o})"
    return None


def check_private_dir(path: Path, key: str) -> None:
    """Refuse (exit 3) a state or cache dir someone else owns or may write; an absent one is made later, 0700.

    Whoever can write it can plant a symlink the daemon would write through (as root) or rename its
    state. A symlink to the directory is followed: what is checked is where the files would go."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise EnvironmentUnusable(
            f"{key} {path} cannot be checked: {exc.strerror or exc}",
            fix=f"make {path} a directory the daemon's user can reach, or set {key} elsewhere",
        ) from None
    problem = private_dir_problem(info.st_mode, info.st_uid, os.geteuid())
    if problem is not None:
        raise EnvironmentUnusable(
            f"{key} {path} {problem}: whoever can write it can redirect the daemon's writes or rename its files",
            fix=f"chown {os.geteuid()} {path} && chmod 700 {path}, or set {key} to a directory of the daemon's own "
            "(not a shared one such as /tmp)",
        )


def check_daemon_dirs(state_dir: Path, cache_dirs: dict[str, Path]) -> None:
    """The state dir and the cache dirs (key -> path) are the daemon's own, or exit 3 naming the first that is not."""
    check_private_dir(state_dir, "state_dir")
    for key, path in cache_dirs.items():
        check_private_dir(path, key)


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
    except OSError as exc:
        raise _unusable(state_dir, exc) from None
    check_private_dir(state_dir, "state_dir")
    try:
        fd = os.open(state_dir / LOCK_NAME, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
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
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # a leftover (or a planted symlink) is removed, never written through
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(out, "w") as handle:
            handle.write(f"{os.getpid()}\n")
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
    """The pid of the daemon holding the lock, or None when no daemon runs; PermissionError when the lock
    cannot be opened by this user."""
    lock_path = state_dir / LOCK_NAME
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except PermissionError:
        raise  # another user's state dir: the caller cannot tell, and says so
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return read_pid(state_dir) or -1
    finally:
        os.close(fd)
    return None
