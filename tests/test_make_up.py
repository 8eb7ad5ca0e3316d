"""`make up` (Makefile) on a machine without a GPU: it stops at `dankserve doctor`, naming each
missing piece with its fix, and starts nothing; never a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dankserve.servicectl import systemd_running
from dankserve.testing.config_file import write_config
from tests.harness.gpus import nvml_unusable_reason

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_up_without_a_gpu_stops_at_doctor_with_the_fixes(tmp_path: Path) -> None:
    """Without a GPU (and no Podman socket), make up lists the failures with fixes and exits non-zero."""
    if nvml_unusable_reason() is None:
        pytest.skip("a GPU is usable here: make up would go on and start the service")
    if systemd_running():
        pytest.skip("systemd runs here: make up would install the unit")
    state = tmp_path / "state"
    config = write_config(
        tmp_path / "dankserve.toml",
        {
            "podman_url": f"unix://{tmp_path / 'no-podman.sock'}",
            "state_dir": str(state),
            "cache_dir": str(tmp_path / "cache"),
            "hf_cache_dir": str(tmp_path / "hf"),
        },
        {"chat": {"model": "o/m", "model_facts": {"parameter_bytes": 2_000_000_000}}},
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k != "MFLAGS"}
    env["DANKSERVE_CONFIG"] = str(config)
    done = subprocess.run(
        ["make", "-s", "-C", str(REPO), "up"], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "[fail] nvidia driver" in out and "fix: install the NVIDIA driver" in out
    # no systemd here (skipped otherwise): the fix is the service by hand, not podman.socket (issue 39, low)
    assert "[fail] podman" in out and f"podman system service --time=0 unix://{tmp_path / 'no-podman.sock'}" in out
    assert "make up: stopped: dankserve doctor exited 3: fix the [fail] lines above" in out
    assert done.returncode == 2, "make ends 2 when a step fails (README, exit codes)"
    assert "Traceback" not in out
    assert not state.exists(), "dankserve up ran although doctor failed"
