"""The process runtime's server in its own PID namespace (issue 41): the command that starts it under
dankserve's init (`pid_init.py`), and what /proc says of such a tree (its init, the pids inside it).

A server so started is three levels: the daemon's child (the "outer", which mirrors the init's end), the
namespace's init (pid 1 inside; what the runtime records, what CRIU dumps and restores with its namespace)
and the server (pid 2 inside). A tree CRIU restored has no outer: its root is the init.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterable
from pathlib import Path

PID_INIT = Path(__file__).with_name("pid_init.py")


def init_command(argv: list[str]) -> list[str]:
    """`argv` run under dankserve's init (standard library only: isolated mode, by path)."""
    return [sys.executable, "-I", str(PID_INIT), *argv]


def namespace_pids(pid: int) -> tuple[int, ...]:
    """The pid of `pid` in each PID namespace it is in, outermost first (`NSpid`; empty when gone)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text(errors="replace").splitlines():
            if line.startswith("NSpid:"):
                return tuple(int(p) for p in line.split()[1:])
    return ()


def inner_pid(pid: int) -> int | None:
    """The pid as the process itself sees it (its innermost namespace's)."""
    found = namespace_pids(pid)
    return found[-1] if found else None


def is_namespace_init(pid: int) -> bool:
    """`pid` is pid 1 of a namespace nested below ours."""
    found = namespace_pids(pid)
    return len(found) >= 2 and found[-1] == 1


def children(pid: int) -> list[int]:
    with contextlib.suppress(OSError, ValueError):
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return []


def namespace_init(pid: int) -> int | None:
    """The init of the server recorded at `pid`: itself (a restored tree, or a record written once the init
    was found), its child (the outer), or None (a server without its own namespace)."""
    if is_namespace_init(pid):
        return pid
    return next((c for c in children(pid) if is_namespace_init(c)), None)


def find_init(outer: int, timeout_s: float = 10.0) -> int | None:
    """The init the outer forks once it runs (bounded wait; None: it ran the server in place, or ended)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        found = namespace_init(outer)
        if found is not None and found != outer:
            return found
        if not Path(f"/proc/{outer}").exists() or _ran_in_place(outer):
            return None
        time.sleep(0.005)
    return None


def _ran_in_place(outer: int) -> bool:
    """The outer exec'd the server itself (no namespace could be made): its command line is no longer ours."""
    with contextlib.suppress(OSError):
        cmdline = Path(f"/proc/{outer}/cmdline").read_bytes().split(b"\0")
        return (
            len(cmdline) > 2
            and not any(part.endswith(PID_INIT.name.encode()) for part in cmdline[:3])
            and (cmdline[0] != b"/bin/sh")
        )
    return False


def host_pids(tree: Iterable[int]) -> dict[int, int]:
    """Each process of a tree by its pid inside its namespace: {inner pid: host pid}."""
    found: dict[int, int] = {}
    for pid in tree:
        inner = inner_pid(pid)
        if inner is not None:
            found[inner] = pid
    return found
