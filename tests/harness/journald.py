"""A real journald for the tests: the machine's when one listens, else a standalone one we start.

Debian's /lib/systemd/systemd-journald runs without systemd as PID 1 and creates
/run/systemd/journal/socket; journalctl then reads what it stored. It is shared by the whole
machine, so it is stopped only if this session started it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dankserve.systemd.journal import JOURNAL_SOCKET, journal_reachable

JOURNALD = Path("/lib/systemd/systemd-journald")


@pytest.fixture(scope="session")
def journald() -> Iterator[str]:
    """The journal socket path of a running journald (skips when none can run here)."""
    if journal_reachable(JOURNAL_SOCKET):
        yield JOURNAL_SOCKET
        return
    if not JOURNALD.exists() or shutil.which("journalctl") is None:
        pytest.skip("systemd-journald or journalctl is not installed")
    if os.geteuid() != 0:
        pytest.skip("starting a standalone journald needs root")
    socket_dir = Path(JOURNAL_SOCKET).parent
    dir_existed = socket_dir.exists()
    process = subprocess.Popen([str(JOURNALD)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not journal_reachable(JOURNAL_SOCKET):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.skip("a standalone journald did not start here")
            time.sleep(0.05)
        yield JOURNAL_SOCKET
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if not dir_existed:  # its sockets are stale now; leave /run as we found it
            shutil.rmtree(socket_dir, ignore_errors=True)


def read_journal(*matches: str, expect: int = 1, timeout: float = 5.0) -> list[dict[str, object]]:
    """Entries matching all `FIELD=value` matches, as `journalctl -o json` gives them (waits for `expect`)."""
    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run(
            ["journalctl", "--no-pager", "-a", "-o", "json", *matches], capture_output=True, text=True, check=False
        )
        entries = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
        if len(entries) >= expect or time.monotonic() > deadline:
            return entries
        time.sleep(0.1)
