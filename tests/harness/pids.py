"""The host's pid space, as the snapshot restore tests need it."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path

from dankserve.processes import become_subreaper
from tests.harness.wait import wait_until

PID_MAX = Path("/proc/sys/kernel/pid_max")
ROOMY = 4194304
"""What systemd (>= 243) sets on real hosts. The kernel's own default, 32768, wraps within a minute under
the parallel suite: a restored tree's pids and thread ids (CRIU recreates every one of them) are then taken by
other tests' processes and the restore falls back to a normal boot, as it should, but not what those tests
check. Servers keep their host pids (a PID namespace of their own kept CUDA from starting, docs/snapshots.md
"Host pids"), so this stays."""


def roomy_pid_space() -> None:
    """Raise kernel.pid_max to systemd's value where it is lower and we may (root); else leave it."""
    with contextlib.suppress(OSError, ValueError):
        if os.geteuid() == 0 and int(PID_MAX.read_text()) < ROOMY:
            PID_MAX.write_text(str(ROOMY))


def set_subreaper(on: bool) -> None:
    if not become_subreaper(on):
        raise OSError("prctl(PR_SET_CHILD_SUBREAPER) was refused")


@contextlib.contextmanager
def adopting_orphans() -> Iterator[None]:
    """While held, this test process is a child subreaper: the orphans of what it started (a server whose daemon
    it killed with -9) come to it rather than to pid 1. A container's pid 1 (CI's) may never reap them: their
    zombies would keep the pids a restore needs taken. Reap them with `reap_gone`."""
    set_subreaper(True)
    try:
        yield
    finally:
        set_subreaper(False)


def _reaped(pids: Iterable[int]) -> bool:
    """Reaps those of `pids` that are this process's zombies; True once none exists."""
    left = False
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        left = left or Path(f"/proc/{pid}").exists()
    return not left


def reap_gone(pids: Iterable[int], timeout: float = 30.0) -> None:
    """Waits until every one of `pids` has exited and been reaped (by this process, inside `adopting_orphans`)."""
    held = tuple(pids)
    wait_until(lambda: _reaped(held) or None, timeout, 0.05, what=f"pids {list(held)} gone")


def take_pid(pid: int) -> subprocess.Popen[bytes] | None:
    """A process holding exactly this pid (set through ns_last_pid, as CRIU itself sets it; root), or None after
    some tries. The caller kills and waits for it."""
    for _ in range(50):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        taker = subprocess.Popen(["sleep", "120"])
        if taker.pid == pid:
            return taker
        taker.kill()
        taker.wait()
    return None
