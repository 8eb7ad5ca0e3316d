"""The fault harness's read-only remount of the state dir: it waits out a write in flight instead of failing.

A bind mount cannot turn read-only while a file is open for writing through it (the kernel
counts writers per mount; mount(8) exits 32, "busy"): the daemon's state save in flight made
the suite's read-only fault flake in CI.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from tests.harness.faults import MOUNT_BUSY, bind_mount, remount_bind

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")


def test_a_writer_makes_the_remount_busy_and_the_harness_waits_it_out(tmp_path: Path) -> None:
    """With a file open for writing the plain remount exits 32; the harness retries until it is closed."""
    with bind_mount(tmp_path):
        writer = (tmp_path / ".state.json.tmp").open("w")
        done = subprocess.run(
            ["mount", "-o", "remount,ro,bind", str(tmp_path)], capture_output=True, text=True, check=False
        )
        assert done.returncode == MOUNT_BUSY, done.stderr
        threading.Timer(0.3, writer.close).start()
        assert remount_bind(tmp_path, read_only=True) > 0
        with pytest.raises(OSError):
            (tmp_path / "x").write_text("x")
        remount_bind(tmp_path, read_only=False)
        (tmp_path / "x").write_text("x")
