"""The real `dankserve` CLI in a subprocess, as a user runs it (no NOTIFY_SOCKET, no DANKSERVE_CONFIG)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


def dankserve(
    config: Path, *args: str, env: Mapping[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`python -m dankserve --config CONFIG ARGS...`, with this process's environment plus `env`."""
    base = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "DANKSERVE_CONFIG")}
    return subprocess.run(
        [sys.executable, "-m", "dankserve", "--config", str(config), *args],
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        timeout=timeout,
        check=False,
    )
