"""The real `dankserve` CLI in a subprocess, as a user runs it (no NOTIFY_SOCKET, no DANKSERVE_CONFIG)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from dankserve.testing import HOSTS_DIR

REPO = Path(__file__).resolve().parents[2]
RECORDED_HOST = HOSTS_DIR / "h200x1-vm.json"


def dankserve_cli(
    config: Path, *args: str, env: Mapping[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`python -m dankserve --config CONFIG ARGS...` with this process's environment plus `env`; its exit code and
    output (never raises on the exit code)."""
    base = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "DANKSERVE_CONFIG")}
    return subprocess.run(
        [sys.executable, "-m", "dankserve", "--config", str(config), *args],
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        cwd=REPO,
        timeout=timeout,
        check=False,
    )


def run_dankserve(config: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`dankserve --config CONFIG ARGS...` on the recorded one-GPU host."""
    return dankserve_cli(config, *args, env={"DANKSERVE_HARDWARE": str(RECORDED_HOST)}, timeout=timeout)


def plan_chat(tmp_path: Path, setting: str) -> subprocess.CompletedProcess[str]:
    """`dankserve plan` of one deployment `chat` (model facts given, no Hub) with one more `setting` line."""
    config = tmp_path / "dankserve.toml"
    config.write_text(
        f'[deployments.chat]\nmodel = "m"\n{setting}\n[deployments.chat.model_facts]\nparameter_bytes = 2_000_000_000\n'
    )
    config.chmod(0o600)
    return run_dankserve(config, "plan")


def run_in_process(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`dankserve ARGS...` through `main` in this process: its exit code, stdout and stderr."""
    from dankserve.cli.main import main

    with pytest.raises(SystemExit) as done:
        main(args)
    out, err = capsys.readouterr()
    code = done.value.code
    return (code if isinstance(code, int) else 1), out, err
