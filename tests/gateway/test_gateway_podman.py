"""The gateway in a real daemon in front of the stand-in vLLM image on the real Podman service."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from dankserve.runtime.base import workload_name
from tests.harness.daemon import MODEL_FACTS, free_port, running_daemon, write_host
from tests.harness.gpus import StandInGpus
from tests.harness.podman_service import PodmanEnv

pytestmark = [pytest.mark.slow, pytest.mark.podman]


def test_gateway_streams_from_a_container_and_waits_through_its_restart(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, vllm_image: str, deployment: str
) -> None:
    """A streamed completion through the gateway from a container; the container killed, a request waits in the
    queue through the restart and is served."""
    dep: dict[str, Any] = {
        "model": "test/tiny",
        "served_model_name": "tiny",
        "image": vllm_image,
        "pull": "never",
        # A restart here is a boot of a new container: no snapshot, no launcher (their own tests:
        # test_daemon_snapshots_podman.py, test_daemon_podman_launcher.py).
        "snapshot": "off",
        "launcher": False,
        "port": free_port(),
        "gpus": [0],
        "env": {"FAKE_VLLM_TIME_SCALE": "0.02", "FAKE_VLLM_TOKEN_SECONDS": "0.02"},
        "model_facts": MODEL_FACTS,
    }
    gateway_port = free_port()
    url = f"http://127.0.0.1:{gateway_port}/v1/chat/completions"
    request = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True}
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])
    globals_ = {"podman_url": podman_env.url, "gateway": {"listen": f"127.0.0.1:{gateway_port}"}}
    with running_daemon(tmp_path, {deployment: dep}, hardware=host, extra_globals=globals_) as daemon:
        daemon.wait_for(deployment, lambda d: d["state"] == "ready", timeout=120)
        with httpx.stream("POST", url, json=request, timeout=30) as reply:
            assert reply.status_code == 200
            events = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        text = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1])
        assert text == "The stand-in vLLM answers with"
        podman_env.podman("kill", workload_name(deployment))
        daemon.wait_for(deployment, lambda d: d["phase"] != "ready" or d["boots"] == 2, timeout=30)
        waited = httpx.post(url, json={**request, "stream": False}, timeout=120)
        assert waited.status_code == 200, waited.text
        status = daemon.deployment(deployment)
        assert status is not None and status["boots"] == 2
