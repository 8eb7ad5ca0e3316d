"""The daemon's `downloading` phase: a real `dankserve run` fetching weights from the stand-in Hub
(the real huggingface_hub client through HF_ENDPOINT) before it boots the stand-in vLLM."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from dankserve.testing.hub import StandInHub
from tests.harness.daemon import free_port, process_deployment, running_daemon
from tests.harness.hub import SLOW_BYTES_PER_SECOND, small_repo

pytestmark = pytest.mark.slow


def test_first_boot_downloads_with_a_percentage_then_serves(hub: StandInHub, tmp_path: Path) -> None:
    """status shows `downloading` with a percentage, sd_notify STATUS= too; then the server boots with the
    weights in hf_cache_dir; a restart of the daemon does not download again."""
    small_repo(hub, "daemon/slow", 4 * SLOW_BYTES_PER_SECOND, bytes_per_second=SLOW_BYTES_PER_SECOND)
    deployment = process_deployment(free_port(), model="daemon/slow", download=True)
    seen: list[int] = []

    def downloading(d: dict[str, Any]) -> bool:
        if d["phase"] == "downloading" and d["weights_percent"] is not None:
            seen.append(d["weights_percent"])
        return bool(d["phase"] == "downloading" and seen and 0 < seen[-1] < 100)

    with running_daemon(tmp_path, {"chat": deployment}, extra_env={"HF_ENDPOINT": hub.url}) as daemon:
        daemon.wait_for("chat", downloading, timeout=30)
        ready = daemon.wait_for("chat", lambda d: d["state"] == "ready", timeout=60)
        assert ready["boots"] == 1
        statuses = [text for _, text in daemon.notifications.messages if "STATUS=" in text]
        assert any(re.search(r"chat: downloading \d+%", s) for s in statuses)
    snapshot = next((tmp_path / "hf" / "hub" / "models--daemon--slow" / "snapshots").iterdir())
    assert (snapshot / "model.safetensors").stat().st_size == 4 * SLOW_BYTES_PER_SECOND
    before = len(hub.requests)
    with running_daemon(tmp_path, {"chat": deployment}, extra_env={"HF_ENDPOINT": hub.url}) as daemon:
        daemon.wait_for("chat", lambda d: d["state"] == "ready", timeout=60)
    assert not [r for r in hub.requests[before:] if "daemon/slow" in r.path]  # complete: the Hub is not asked


def test_a_gated_model_fails_the_deployment_with_the_fix(hub: StandInHub, tmp_path: Path) -> None:
    """No token for a gated model: the deployment fails (not retried), its message naming hf_token_file."""
    deployment = process_deployment(free_port(), model="org/gated", download=True)
    with running_daemon(tmp_path, {"chat": deployment}, extra_env={"HF_ENDPOINT": hub.url}) as daemon:
        failed = daemon.wait_for("chat", lambda d: d["state"] == "failed", timeout=30)
        assert "gated" in (failed["message"] or "") and "hf_token_file" in (failed["message"] or "")
        assert failed["boots"] == 0
