"""Snapshots of a Podman deployment (issue 41, docs/snapshots.md "Podman") through a real daemon, the real
Podman service and real CRIU, with the stand-in vLLM image: the ready container is captured once (Podman's
checkpoint with export, then restored in place at once); a kill -9 of it restores the archive with import
(boot kind `restore`, the same greedy ids, no boot in its log); each failure falls back to the normal boot
with the reason in status, and the deployment serves.

The stand-in maps a /dev/shm file deleted from its first name (FAKE_VLLM_SHM_SEMAPHORE, as glibc's sem_open
leaves vLLM's semaphores): CRIU needs link-remap for it, and a checkpoint that left the container running
would lose the link-remap file a later restore needs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from dankserve.doctor import read_criu
from dankserve.runtime.base import CONTAINER_HF_HOME, workload_name
from dankserve.snapshot.criu import criu_path
from tests.harness.daemon import MODEL_FACTS, RunningDaemon, free_port, running_daemon, write_host
from tests.harness.gpus import StandInGpus
from tests.harness.podman_service import PodmanEnv

_reading = read_criu(criu_path())
pytestmark = [
    pytest.mark.slow,
    pytest.mark.podman,
    pytest.mark.skipif(
        _reading.path is None or not _reading.check_ok or os.geteuid() != 0,
        reason="needs root and a working CRIU >= 4.2 (make system-deps)",
    ),
]
READY = "Application startup complete."


def _deployment(image: str, port: int, **extra: Any) -> dict[str, Any]:
    env = {
        "FAKE_VLLM_TIME_SCALE": "0.02",
        "FAKE_VLLM_NVML_DIR": f"{CONTAINER_HF_HOME}/host.json.processes",  # the mounted HF cache
        "FAKE_VLLM_SHM_SEMAPHORE": "1",
        **extra.pop("env", {}),
    }
    return {
        "model": "test/tiny",
        "image": image,
        "pull": "never",
        "port": port,
        "gpus": [0],
        "listen": "tcp",
        "shm_size": "64m",
        "snapshot": "auto",
        "env": env,
        "model_facts": MODEL_FACTS,
        **extra,
    }


def _host(tmp_path: Path, gpus: StandInGpus) -> Path:
    (tmp_path / "hf").mkdir(exist_ok=True)
    return write_host(tmp_path / "hf" / "host.json", uuids=[g.uuid for g in gpus.gpus])


def _daemon(tmp_path: Path, env: PodmanEnv, name: str, dep: dict[str, Any], host: Path, **extra: Any) -> Any:
    return running_daemon(tmp_path, {name: dep}, hardware=host, extra_globals={"podman_url": env.url}, **extra)


def _ids(port: int) -> list[int]:
    body = {"model": "test/tiny", "prompt": "x", "max_tokens": 5, "temperature": 0, "return_token_ids": True}
    answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    return list(answer.json()["choices"][0]["token_ids"])


def _captured(daemon: RunningDaemon, name: str) -> dict[str, Any]:
    return daemon.wait_for(name, lambda d: d["state"] == "ready" and d["snapshot"]["state"] == "ready", timeout=120)


def _restored(daemon: RunningDaemon, name: str, count: int = 1) -> dict[str, Any]:
    return daemon.wait_for(
        name, lambda d: d["state"] == "ready" and d["boots_by_kind"].get("restore") == count, timeout=90
    )


def _booted_normally(daemon: RunningDaemon, name: str, boots: int) -> dict[str, Any]:
    return daemon.wait_for(
        name,
        lambda d: d["state"] == "ready" and d["boots"] == boots and (d["last_boot"] or {}).get("kind") != "restore",
        timeout=120,
    )


def _container(env: PodmanEnv, name: str) -> dict[str, Any]:
    inspected: dict[str, Any] = json.loads(env.podman("inspect", name).stdout)[0]
    return inspected


def _boots_in_log(env: PodmanEnv, deployment: str) -> int:
    return env.podman("logs", workload_name(deployment)).stderr.count(READY)


def _kill(env: PodmanEnv, deployment: str) -> None:
    env.podman("kill", "--signal", "KILL", workload_name(deployment))


def test_captured_then_killed_with_9_the_container_is_restored_from_the_archive(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, vllm_image: str, deployment: str
) -> None:
    """Captured without leaving the container running (then restored in place: it serves on), killed with
    -9, restored twice from the same archive: the same greedy ids, no boot, boot kind `restore`."""
    host = _host(tmp_path, gpus)
    port = free_port()
    name = workload_name(deployment)
    with _daemon(tmp_path, podman_env, deployment, _deployment(vllm_image, port), host) as daemon:
        first = _captured(daemon, deployment)
        assert first["snapshot"]["last_capture_outage_seconds"] > 0
        ids = _ids(port)
        entry = daemon.state_dir / "snapshots" / deployment
        manifest = json.loads((entry / "manifest.json").read_text())
        assert manifest["runtime"] == "podman" and manifest["holders"], manifest
        archive = entry / "images" / "checkpoint.tar"
        assert archive.stat().st_mode & 0o077 == 0
        listed = subprocess.run(["tar", "tf", str(archive)], capture_output=True, text=True, check=True).stdout
        assert "devshm-checkpoint.tar" in listed
        annotations = _container(podman_env, name)["Config"]["Annotations"]
        assert annotations["org.criu.config"].endswith(".podman-criu.conf")
        booted = _boots_in_log(podman_env, deployment)
        for count in (1, 2):
            _kill(podman_env, deployment)
            after = _restored(daemon, deployment, count)
            assert _ids(port) == ids
            assert _boots_in_log(podman_env, deployment) == booted, "restored, not booted"
            assert after["snapshot"]["last_failure"] is None, after["snapshot"]
            assert after["restarts"] == count
        assert _container(podman_env, name)["State"]["Restored"] is True
        shown = daemon.cli("status", deployment).stdout
        assert "snapshot ready: restored from it" in shown, shown
        _no_failure_counted(daemon)


def _no_failure_counted(daemon: RunningDaemon) -> None:
    assert not daemon.events_named("deployment_failed")
    assert {e["failure"] for e in daemon.events_named("boot_failed")} <= {"engine_dead"}
