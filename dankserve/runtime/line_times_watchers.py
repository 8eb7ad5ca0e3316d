"""The process runtime's line-times watchers (`runtime.line_times`), one per server it starts: started
detached beside the server, reaped once the server has ended."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path


class LineTimeWatchers:
    """Each server's line-times watcher, by the server's pid."""

    def __init__(self) -> None:
        self._watchers: dict[int, subprocess.Popen[bytes]] = {}

    def __len__(self) -> int:
        """How many watchers are not reaped yet."""
        return len(self._watchers)

    def start(self, pid: int, create_time: float, log: Path, times: Path) -> None:
        """Start the detached watcher that writes each log line's time beside the log (`runtime.line_times`).

        Not waited for (a Python start, ~0.15 s, would delay every boot): vLLM's imports take seconds before
        its first line, and a line written before the watcher's first read takes that read's time. Without
        a watcher (it cannot run), the lines have no stored times and `dankserve logs` reads vLLM's prefix."""
        for server, watcher in list(self._watchers.items()):
            if watcher.poll() is not None:
                del self._watchers[server]
        try:
            log_fd = os.open(log, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return
        try:
            times_fd = os.open(times, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        except OSError:
            os.close(log_fd)
            return
        try:
            self._watchers[pid] = subprocess.Popen(
                [sys.executable, "-m", "dankserve.runtime.line_times", str(pid), repr(create_time)],
                stdin=log_fd,
                stdout=times_fd,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # outlives this daemon, as the server does
                env={k: v for k, v in os.environ.items() if not k.startswith("NOTIFY_SOCKET")},  # not the server's
                close_fds=True,
            )
        except OSError:
            pass
        finally:
            os.close(log_fd)
            os.close(times_fd)

    def reap(self, pid: int, timeout: float) -> None:
        """Reap the ended server's watcher (it ends once it has read the last lines); one still reading is
        reaped by a later start."""
        watcher = self._watchers.get(pid)
        if watcher is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                watcher.wait(timeout=timeout)
                del self._watchers[pid]
