"""Verified sleeps and wakes (issue 29) in a real daemon on the real Podman service, with the stand-in
image: a sleep that keeps its memory (seen through the stand-in's per-process NVML records, written in
the mounted HF cache beside the recorded host) is stopped instead; a wake answering other tokens is
stopped and booted. Each marks its level unsafe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from dankserve.runtime.base import CONTAINER_HF_HOME, workload_name
from tests.harness.daemon import RunningDaemon, free_port, running_daemon, write_host
from tests.harness.gpus import StandInGpus
from tests.harness.podman_service import PodmanEnv
from tests.supervisor.test_swap_podman import _member as swap_member
from tests.supervisor.test_swap_podman import members

__all__ = ["members"]  # the fixture: three member names, their containers removed after

pytestmark = [pytest.mark.slow, pytest.mark.podman]


def _member(image: str, model: str, **env: str) -> dict[str, Any]:
    """test_swap_podman's member at sleep_level 1, with these stand-in knobs."""
    return swap_member(image, model, sleep_level="1", env={"FAKE_VLLM_TIME_SCALE": "0.02", **env})


def _unsafe(daemon: RunningDaemon, name: str) -> list[str]:
    status = daemon.deployment(name)
    assert status is not None
    return sorted(u["level"] for u in status["swap"]["unsafe_levels"])


def _complete(url: str, model: str) -> int:
    reply = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 2}, timeout=120)
    return reply.status_code


def test_a_container_whose_sleep_keeps_its_memory_is_stopped_instead(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, vllm_image: str, members: list[str]
) -> None:
    """b's level-1 sleep at start-up answers but its process keeps its bytes: b's container is stopped,
    level 1 marked unsafe; woken by a boot, b answers; a's sleep frees its memory and passes."""
    a, b, _ = members
    (tmp_path / "hf").mkdir()
    host = write_host(tmp_path / "hf" / "host.json", uuids=[g.uuid for g in gpus.gpus])
    records = f"{CONTAINER_HF_HOME}/host.json.processes"  # the same directory, as the container sees it
    deployments = {
        a: _member(vllm_image, "ma", FAKE_VLLM_NVML_DIR=records),
        b: _member(vllm_image, "mb", FAKE_VLLM_NVML_DIR=records, FAKE_VLLM_SLEEP_KEEPS_MEMORY="1"),
    }
    gateway = free_port()
    url = f"http://127.0.0.1:{gateway}"
    globals_ = {"podman_url": podman_env.url, "gateway": {"listen": f"127.0.0.1:{gateway}"}}
    with running_daemon(tmp_path, deployments, hardware=host, extra_globals=globals_) as daemon:
        daemon.wait_for(a, lambda d: d["state"] == "ready", timeout=180)
        asleep = daemon.wait_for(b, lambda d: d["state"] == "asleep", timeout=60)
        assert asleep["swap"]["level"] == "stop"
        assert _unsafe(daemon, b) == ["1"]
        assert podman_env.podman("ps", "-q", "--filter", f"name=^{workload_name(b)}$").stdout.strip() == ""
        assert _complete(url, "mb") == 200
        daemon.wait_for(a, lambda d: d["state"] == "asleep" and d["swap"]["level"] == "1", timeout=60)
        assert [e["deployment"] for e in daemon.events_named("sleep_verified")] == [a]
        assert _unsafe(daemon, a) == []


def test_a_container_woken_to_other_tokens_is_stopped_and_booted(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, vllm_image: str, members: list[str]
) -> None:
    """a's wake answers other token ids than its fingerprint: a new container boots, level 1 is unsafe, and
    the request that woke it is answered."""
    a, b, _ = members
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])
    deployments = {a: _member(vllm_image, "ma", FAKE_VLLM_WAKE_TOKENS_DIFFER="1"), b: _member(vllm_image, "mb")}
    gateway = free_port()
    url = f"http://127.0.0.1:{gateway}"
    globals_ = {"podman_url": podman_env.url, "gateway": {"listen": f"127.0.0.1:{gateway}"}}
    with running_daemon(tmp_path, deployments, hardware=host, extra_globals=globals_) as daemon:
        first = daemon.wait_for(a, lambda d: d["state"] == "ready", timeout=180)
        daemon.wait_for(b, lambda d: d["state"] == "asleep", timeout=60)
        assert _complete(url, "mb") == 200
        daemon.wait_for(a, lambda d: d["state"] == "asleep", timeout=60)
        assert _complete(url, "ma") == 200
        daemon.wait_for(a, lambda d: d["state"] == "ready" and d["boots"] == first["boots"] + 1, timeout=120)
        assert [e["deployment"] for e in daemon.events_named("woke_wrong")] == [a]
        assert _unsafe(daemon, a) == ["1"]
