"""The process runtime's server in its own PID namespace (issue 41): the command that starts it under
dankserve's init (`pid_init.py`), and what /proc says of such a tree (its init, the pids inside it).

A server so started is three levels: the daemon's child (the "outer", which mirrors the init's end), the
namespace's init (pid 1 inside; what the runtime records, what CRIU dumps and restores with its namespace)
and the server (pid 2 inside). A tree CRIU restored has no outer: its root is the init.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

from dankserve.processes import is_namespace_init

PID_INIT = Path(__file__).with_name("pid_init.py")


def init_command(argv: list[str]) -> list[str]:
    """`argv` run under dankserve's init (standard library only: isolated mode, by path)."""
    return [sys.executable, "-I", str(PID_INIT), *argv]


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


def signal_server(pid: int, sig: int) -> None:
    """The server recorded at `pid`, whole: through its namespace's init when it has one (the init passes a
    stop signal to every process of its namespace; a SIGKILL of it ends them all; its outer, if any, goes
    too), else its process group (a server without its own namespace)."""
    init = namespace_init(pid)
    if init is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(init, sig)
        if init == pid or sig != signal.SIGKILL:
            return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


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
