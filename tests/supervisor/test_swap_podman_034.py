"""The stand-in at vLLM 0.34 through a swap group (issue 42), in a real daemon on the real Podman service.

0.34 answers the sleep routes with JSON, counts its sleep-mode operations and refuses beyond
`--max-num-queued-reqs`; dankserve reads the answers, relays the metrics, plans the admission limit
from the gateway's queue, and keeps FlashInfer's kernels (`vllm download-kernels`) in the cache dir."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dankserve.runtime.base import workload_name
from tests.harness.daemon import free_port, running_daemon, write_host
from tests.harness.gpus import StandInGpus
from tests.harness.images import stand_in_release
from tests.harness.podman_service import PodmanEnv
from tests.harness.wait import wait_until
from tests.supervisor.test_swap_podman import _member

pytestmark = [pytest.mark.slow, pytest.mark.podman]


@pytest.fixture
def members(podman_env: PodmanEnv, deployment: str) -> Iterator[list[str]]:
    names = [f"{deployment}-a", f"{deployment}-b"]
    yield names
    for name in names:
        podman_env.podman("rm", "-f", "-t", "0", workload_name(name), check=False)


def test_a_0_34_swap_group_sleeps_wakes_and_reports_its_operations(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, vllm_image: str, members: list[str]
) -> None:
    """Two 0.34 members on one GPU: a request for the sleeping one swaps them (JSON answers read), the daemon
    relays 0.34's sleep-mode metrics, each container got --max-num-queued-reqs from the gateway's queue and
    ran `vllm download-kernels` into its kept cache dir on its first boot."""
    image = stand_in_release(podman_env, vllm_image, "0.34.0")
    a, b = members
    deployments = {a: _member(image, "ma", sleep_level="1"), b: _member(image, "mb", sleep_level="1")}
    gateway_port, metrics = free_port(), f"127.0.0.1:{free_port()}"
    url = f"http://127.0.0.1:{gateway_port}/v1/completions"
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])
    globals_ = {
        "podman_url": podman_env.url,
        "gateway": {"listen": f"127.0.0.1:{gateway_port}", "queue_size": 16},
        "metrics_listen": metrics,
        "serving_scrape_interval_seconds": 0.5,
    }
    with running_daemon(tmp_path, deployments, hardware=host, extra_globals=globals_) as daemon:
        daemon.wait_for(a, lambda d: d["state"] == "ready" and d["vllm_version"] == "0.34.0", timeout=180)
        daemon.wait_for(b, lambda d: d["state"] == "asleep", timeout=60)

        reply = httpx.post(url, json={"model": "mb", "prompt": "hi", "max_tokens": 2}, timeout=120)
        assert reply.status_code == 200, reply.text
        daemon.wait_for(a, lambda d: d["state"] == "asleep", timeout=30)
        woke = daemon.wait_for(b, lambda d: d["state"] == "ready", timeout=30)
        assert woke["swap"]["last_wake_seconds"] is not None

        for name in (a, b):
            command = json.loads(podman_env.podman("inspect", workload_name(name)).stdout)[0]["Config"]["Cmd"]
            seqs = int(command[command.index("--max-num-seqs") + 1])
            assert command[command.index("--max-num-queued-reqs") + 1] == str(seqs + 16)
            kept = tmp_path / "cache" / "deployments" / name / "vllm" / "kernels" / "0.34.0"
            assert (kept / "flashinfer_cubin").is_dir() and (kept / "flashinfer_jit_cache").is_dir()

        def relayed() -> str | None:
            """The relayed metrics once they hold a's wake and the admission counter."""
            with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5) as answer:
                text = str(answer.read().decode())
            return text if 'operation="wake"' in text and "vllm:admission_rejections_total" in text else None

        # the observatory reads each server's /metrics every 0.5 s
        text = wait_until(relayed, 30, 0.5, what="the relayed wake and admission metrics")

        wakes = [
            line for line in text.splitlines() if line.startswith("vllm:sleep_mode_operation_duration_seconds_count")
        ]
        assert any('operation="wake"' in line and b in line for line in wakes), text
        assert "vllm:admission_rejections_total" in text
