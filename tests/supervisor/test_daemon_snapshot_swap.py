"""A swap member asleep by stop (`sleep_level = "stop"`: no sleep mode) is booted again on wake; with a valid
snapshot that boot is a restore (issue 41, item 4): through a real daemon on the process runtime, real CRIU and
the stand-in vLLM, the woken member's boot kind is `restore`, it serves the same greedy ids, and its log shows
no second boot."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from dankserve.doctor import read_criu
from dankserve.snapshot.criu import criu_path
from tests.harness.daemon import RunningDaemon, free_port, process_deployment, running_daemon, write_host

_reading = read_criu(criu_path())
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        _reading.path is None or not _reading.check_ok or os.geteuid() != 0,
        reason="needs root and a working CRIU >= 4.2 (make system-deps)",
    ),
]
READY = "Application startup complete."


def _member(host: Path, port: int, model: str) -> dict[str, Any]:
    env = {"FAKE_VLLM_NVML_DIR": str(host.with_name(host.name + ".processes"))}
    return process_deployment(
        port,
        gpus=[0],
        listen="tcp",
        snapshot="auto",
        env=env,
        served_model_name=model,
        swap_group="g",
        sleep_level="stop",
        gpu_memory_utilization=0.9,
    )


def _ids(url: str, model: str) -> list[int]:
    body = {"model": model, "prompt": "x", "max_tokens": 5, "temperature": 0, "return_token_ids": True}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return list(answer.json()["choices"][0]["token_ids"])


def _boots_in_log(daemon: RunningDaemon, name: str) -> int:
    return (daemon.state_dir / "processes" / f"{name}.log").read_text(errors="replace").count(READY)


def _ready_captured(daemon: RunningDaemon, name: str) -> dict[str, Any]:
    return daemon.wait_for(
        name, lambda d: d["state"] == "ready" and d["snapshot"]["state"] == "ready", timeout=90
    )


def test_a_member_asleep_by_stop_is_woken_by_a_restore_serving_the_same_ids(tmp_path: Path) -> None:
    gateway = free_port()
    url = f"http://127.0.0.1:{gateway}"
    host = write_host(tmp_path / "host.json")
    deployments = {"a": _member(host, free_port(), "ma"), "b": _member(host, free_port(), "mb")}
    settings = {"gateway": {"listen": f"127.0.0.1:{gateway}"}}
    with running_daemon(tmp_path, deployments, hardware=host, extra_globals=settings) as daemon:
        _ready_captured(daemon, "a")
        ids_a = _ids(url, "ma")
        daemon.wait_for("b", lambda d: d["state"] == "asleep", timeout=60)

        ids_b = _ids(url, "mb")  # a stopped, b woken (by a restore or a first boot, then captured)
        _ready_captured(daemon, "b")
        asleep = daemon.wait_for("a", lambda d: d["state"] == "asleep", timeout=60)
        assert asleep["swap"]["level"] == "stop"
        booted_a = _boots_in_log(daemon, "a")

        assert _ids(url, "ma") == ids_a  # b stopped, a woken by its stop+boot: a restore
        woken = daemon.wait_for("a", lambda d: d["state"] == "ready", timeout=60)
        assert (woken["last_boot"] or {}).get("kind") == "restore", woken["last_boot"]
        assert _boots_in_log(daemon, "a") == booted_a, "restored, not booted"
        assert woken["snapshot"]["last_restore_seconds"] > 0
        daemon.wait_for("b", lambda d: d["state"] == "asleep" and d["swap"]["level"] == "stop", timeout=60)

        booted_b = _boots_in_log(daemon, "b")
        assert _ids(url, "mb") == ids_b  # and b's next wake restores too
        woken_b = daemon.wait_for("b", lambda d: d["state"] == "ready", timeout=60)
        assert (woken_b["last_boot"] or {}).get("kind") == "restore", woken_b["last_boot"]
        assert _boots_in_log(daemon, "b") == booted_b
        wakes = [e for e in daemon.events_named("ready") if e.get("restored")]
        assert [e["deployment"] for e in wakes][-2:] == ["a", "b"]
        assert not daemon.events_named("snapshot_restore_failed")
