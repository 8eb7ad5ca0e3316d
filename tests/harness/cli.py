"""The real `dankserve` command line in a subprocess, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

RECORDED_HOST = Path(__file__).resolve().parents[1] / "hosts" / "h200x1-vm.json"


def run_dankserve(config: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`dankserve --config CONFIG ARGS...` on the recorded one-GPU host, its output captured; never raises on exit."""
    env = {**os.environ, "DANKSERVE_HARDWARE": str(RECORDED_HOST)}
    env.pop("NOTIFY_SOCKET", None)
    return subprocess.run(
        [sys.executable, "-m", "dankserve", "--config", str(config), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
