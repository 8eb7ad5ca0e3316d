"""Snapshots in the lifecycle (issue 41) through a real daemon on the process runtime, with real CRIU and the
stand-in vLLM (an API server and its engine core, the engine core's GPU record checkpointed through the
stand-in's GPU edge): the ready server is captured once; a kill -9 of it restores the snapshot (boot kind
`restore`, the same greedy ids, no boot in its log); each failure (a corrupt or truncated snapshot, one of
another plan, a taken pid, CRIU missing) falls back to the normal boot in the same restart, with the reason
in status, no failure counted, and the server serving."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from dankserve.doctor import read_criu
from dankserve.snapshot.criu import criu_path
from tests.harness.daemon import RunningDaemon, free_port, process_deployment, running_daemon, write_host
from tests.harness.wait import wait_until
from tests.test_snapshot_criu import damage_images

_reading = read_criu(criu_path())
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        _reading.path is None or not _reading.check_ok or os.geteuid() != 0,
        reason="needs root and a working CRIU >= 4.2 (make system-deps)",
    ),
]
READY = "Application startup complete."


def _deployment(host: Path, port: int, **extra: Any) -> dict[str, Any]:
    env = {"FAKE_VLLM_NVML_DIR": str(host.with_name(host.name + ".processes")), **extra.pop("env", {})}
    return process_deployment(port, gpus=[0], listen="tcp", snapshot="auto", env=env, **extra)


def _server_pid(daemon: RunningDaemon) -> int:
    pid: int = json.loads((daemon.state_dir / "processes" / "chat.json").read_text())["pid"]
    return pid


def _ids(port: int) -> list[int]:
    body = {"model": "test/tiny", "prompt": "x", "max_tokens": 5, "temperature": 0, "return_token_ids": True}
    answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    return list(answer.json()["choices"][0]["token_ids"])


def _captured(daemon: RunningDaemon) -> dict[str, Any]:
    return daemon.wait_for("chat", lambda d: d["state"] == "ready" and d["snapshot"]["state"] == "ready", timeout=90)


def _boots_in_log(daemon: RunningDaemon) -> int:
    return (daemon.state_dir / "processes" / "chat.log").read_text(errors="replace").count(READY)


def _kill(daemon: RunningDaemon) -> int:
    pid = _server_pid(daemon)
    os.kill(pid, signal.SIGKILL)
    return pid


def test_captured_then_killed_with_9_the_server_is_restored_serving_the_same_ids(tmp_path: Path) -> None:
    host = write_host(tmp_path / "host.json")
    port = free_port()
    with running_daemon(tmp_path, {"chat": _deployment(host, port)}, hardware=host) as daemon:
        first = _captured(daemon)
        assert first["snapshot"]["last_capture_outage_seconds"] > 0
        ids = _ids(port)
        booted = _boots_in_log(daemon)
        pid = _kill(daemon)
        restored = daemon.wait_for("chat", lambda d: d["state"] == "ready" and (d["last_boot"] or {}).get("kind") == "restore", timeout=60)
        assert _server_pid(daemon) == pid, "CRIU restores the tree with its pids"
        assert _ids(port) == ids
        assert _boots_in_log(daemon) == booted, "restored, not booted"
        assert restored["snapshot"]["last_restore_seconds"] > 0
        assert restored["restarts"] == 1
        metrics = daemon.cli("status", "chat")
        assert "snapshot" in metrics.stdout
