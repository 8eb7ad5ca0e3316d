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
from collections.abc import Iterator
from pathlib import Path

import pytest

from dankserve.systemd.journal import JOURNAL_SOCKET, journal_reachable
from tests.harness.wait import holds_within

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
        if not holds_within(lambda: process.poll() is not None or journal_reachable(JOURNAL_SOCKET), 10, 0.05) or (
            process.poll() is not None
        ):
            pytest.skip("a standalone journald did not start here")
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
    entries: list[dict[str, object]] = []

    def read() -> bool:
        nonlocal entries
        done = subprocess.run(
            ["journalctl", "--no-pager", "-a", "-o", "json", *matches], capture_output=True, text=True, check=False
        )
        entries = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
        return len(entries) >= expect

    holds_within(read, timeout, 0.1)  # the caller asserts on what came, however many
    return entries
