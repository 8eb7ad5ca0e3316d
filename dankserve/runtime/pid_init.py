"""dankserve's init: the process runtime's server in its own PID namespace (issue 41, docs/snapshots.md).

Run as `python -I pid_init.py ARGV...` (standard library only, by path, so it starts in milliseconds and
needs nothing of dankserve's imports). It unshares a new PID namespace and forks: the child is that
namespace's init (pid 1), which forks the server (pid 2, `exec ARGV`), forwards the stop signals to every
process of the namespace, reaps orphans, and exits with the server's status. The first process (the
daemon's child, what the runtime records) waits for the init, forwards the same signals to it, and ends
as it ended: with its exit code, or killed by the signal that killed the server.

Why: CRIU dumps a tree whose root is a PID namespace's init with the namespace, and `criu restore`
recreates it, so a restored server gets its own pids back inside a new namespace, whatever host pids
are taken meanwhile. Where the namespace cannot be made (not root), the server is exec'd in place, as
before: the runtime finds the shape from /proc (`runtime.pid_namespace`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

CLONE_NEWPID = 0x20000000
_PR_SET_NAME = 15
NAME = b"dankserve-init"
"""The init's process name (comm), so process listings say what it is."""
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
"""The stop signals: to the init, then to every process of the namespace (the stop's SIGINT reaches the
whole server, as a signal to its process group did before)."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _status_code(status: int) -> int:
    """A wait status as an exit code: the code, or 128 + the signal that killed (as a shell says it)."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


def _init(argv: list[str]) -> None:
    """pid 1 of the new namespace: the server's parent, every orphan's reaper."""
    libc = _libc()
    libc.prctl(_PR_SET_NAME, ctypes.c_char_p(NAME), 0, 0, 0)
    os.setsid()  # the tree's own session and group: CRIU dumps no session led from outside the tree
    server = os.fork()
    if server == 0:
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        try:
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(2, f"dankserve-init: cannot run {argv[0]}: {exc.strerror}\n".encode())
            os._exit(127)

    def forward(sig: int, _frame: object) -> None:
        # kill(-1) from a namespace's init: every process in it but the init itself.
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, sig)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
        if pid == server:
            # The namespace ends with its init: whatever the server left is killed by the kernel.
            os._exit(_status_code(status))


def _outer(init: int) -> None:
    """The daemon's child: forwards the stop signals to the init, ends as the server ended."""
    for sig in FORWARDED:
        signal.signal(sig, lambda sig, _frame: _forward(init, sig))
    while True:
        try:
            _, status = os.waitpid(init, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(1)
    code = _status_code(status)
    if code > 128 and code - 128 < signal.NSIG:  # killed by a signal: end the same way (the runtime reads it)
        ended = code - 128
        if ended not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(ended, signal.SIG_DFL)
        os.kill(os.getpid(), ended)
    os._exit(code)


def _forward(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def main(argv: list[str]) -> None:
    if not argv:
        os.write(2, b"usage: pid_init.py COMMAND [ARG...]\n")
        os._exit(2)
    libc = _libc()
    if libc.unshare(CLONE_NEWPID) != 0:  # not root: the server runs in place, in the host's namespace
        os.execvp(argv[0], argv)
    init = os.fork()
    if init == 0:
        # No PR_SET_PDEATHSIG: CRIU restores it, and the restored init's parent (criu) ends at once. The
        # runtime signals the init itself (`pid_namespace.namespace_init`), not the outer.
        _init(argv)
    _outer(init)


if __name__ == "__main__":
    main(sys.argv[1:])
