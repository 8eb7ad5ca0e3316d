"""`python -m dankserve.runtime.line_times PID START_TIME <LOG >TIMES`: the line times of a process server's log.

A process server writes its log file itself (no conmon to stamp each line, as Podman's k8s-file log
has), so this watcher, started with it and detached as it is (it outlives a daemon killed with -9),
follows the file as it grows and writes to TIMES, for each line, the time its first bytes appeared
(`logfile.line_time_record`: to the microsecond, woken by inotify within a millisecond of the write).
`dankserve logs` reads them (`ProcessRuntime.timed_logs`) as it reads conmon's times, instead of vLLM's
whole-second prefix. Both files come open (stdin, stdout), so a log renamed by the next start is still
the one followed. It ends when the server (PID, started at START_TIME) has ended and the log is read
to its end.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from dankserve.processes import is_same_process
from dankserve.runtime.logfile import ChangeWatch, line_time_record, poll_briefly

LOG_FD, TIMES_FD = 0, 1


def follow(pid: int, start_time: float) -> None:
    """Write a time per line of the log (LOG_FD) to TIMES_FD until the server has ended and the log is read."""
    watch = ChangeWatch.open(Path(f"/proc/self/fd/{LOG_FD}"), pid)  # inotify follows the link to the file
    pending_since: float | None = None  # when the line not yet ended began
    done = False
    try:
        while True:
            chunk = os.read(LOG_FD, 65536)
            if chunk:
                now = time.time()
                ended = chunk.count(b"\n")
                if ended:
                    first = pending_since if pending_since is not None else now
                    os.write(TIMES_FD, line_time_record(first) + line_time_record(now) * (ended - 1))
                    pending_since = None
                if not chunk.endswith(b"\n") and pending_since is None:
                    pending_since = now
                continue
            if done:
                break
            if not is_same_process(pid, start_time):
                done = True  # read once more: what it wrote before it ended
                continue
            if watch is not None:
                watch.wait()
            else:
                poll_briefly()
        if pending_since is not None:  # the last line, without its newline
            os.write(TIMES_FD, line_time_record(pending_since))
    finally:
        if watch is not None:
            watch.close()


if __name__ == "__main__":
    follow(int(sys.argv[1]), float(sys.argv[2]))
