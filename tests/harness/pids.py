"""The host's pid space, as the snapshot restore tests need it."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PID_MAX = Path("/proc/sys/kernel/pid_max")
ROOMY = 4194304
"""What systemd (>= 243) sets on real hosts. The kernel's own default, 32768, wraps within a minute under
the parallel suite: a restored tree's pids and thread ids (CRIU recreates every one of them) are then taken by
other tests' processes and the restore falls back to a normal boot, as it should, but not what those tests
check. Starting servers in their own PID namespace (issue 41) will make this unnecessary."""


def roomy_pid_space() -> None:
    """Raise kernel.pid_max to systemd's value where it is lower and we may (root); else leave it."""
    with contextlib.suppress(OSError, ValueError):
        if os.geteuid() == 0 and int(PID_MAX.read_text()) < ROOMY:
            PID_MAX.write_text(str(ROOMY))
