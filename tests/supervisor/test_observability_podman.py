"""End-to-end observability on the real Podman service with the stand-in vLLM image: a real
Prometheus scrapes the daemon's /metrics through a boot and a killed container, and a hung
engine (/health still 200) is caught by the token probe and by stall detection."""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from dankserve.runtime.base import workload_name
from tests.harness.daemon import MODEL_FACTS, free_port, running_daemon, write_host
from tests.harness.gpus import StandInGpus
from tests.harness.podman_service import PodmanEnv
from tests.harness.prometheus import prometheus, prometheus_missing

pytestmark = pytest.mark.slow


def ready(d: dict[str, Any]) -> bool:
    return bool(d["state"] == "ready")


def deployment_config(image: str, **env: str) -> dict[str, Any]:
    return {
        "model": "test/tiny",
        "image": image,
        "pull": "never",
        # A restart here is a boot of a new container: no snapshot, no launcher (their own tests:
        # test_daemon_snapshots_podman.py, test_daemon_podman_launcher.py).
        "snapshot": "off",
        "launcher": False,
        "port": free_port(),
        "gpus": [0],
        "env": {"FAKE_VLLM_TIME_SCALE": "0.02", **env},
        "model_facts": MODEL_FACTS,
    }


@pytest.mark.skipif(prometheus_missing() is not None, reason=str(prometheus_missing()))
def test_prometheus_sees_a_boot_then_a_restart_after_a_killed_container(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, vllm_image: str, deployment: str
) -> None:
    """Prometheus stores the ready state, a cold boot, vLLM's relayed gauges and GPU memory; after podman kill the
    restarts counter rose by one and a learned-bytes boot followed; status --json shows the same counts."""
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])
    listen = f"127.0.0.1:{free_port()}"
    config = deployment_config(vllm_image)
    settings = {"podman_url": podman_env.url, "metrics_listen": listen, "serving_scrape_interval_seconds": 0.5}
    with (
        running_daemon(tmp_path, {deployment: config}, hardware=host, extra_globals=settings) as daemon,
        prometheus(tmp_path / "prometheus", [listen]) as prom,
    ):
        daemon.wait_for(deployment, ready, timeout=120)
        on = f'deployment="{deployment}"'
        prom.wait_value(f'dankserve_deployment_state{{{on},state="ready"}}', 1.0)
        prom.wait_value(f'dankserve_boots_total{{{on},kind="cold"}}', 1.0)
        prom.wait_value(f'dankserve_boot_duration_seconds_count{{{on},kind="cold"}}', 1.0)
        prom.wait_value(f"sum(dankserve_restarts_total{{{on}}})", 0.0)
        prom.wait_value(f"count(vllm:num_requests_running{{{on}}})", 1.0)
        prom.wait_value(f"count(vllm:kv_cache_usage_perc{{{on}}})", 1.0)
        prom.wait_value(f"dankserve_kv_cache_learned_used{{{on}}}", 0.0)
        assert prom.value(f"dankserve_kv_cache_memory_bytes{{{on}}}")
        assert prom.value('dankserve_gpu_memory_total_bytes{gpu="0"}')

        podman_env.podman("kill", workload_name(deployment))
        daemon.wait_for(deployment, lambda d: ready(d) and d["boots"] == 2, timeout=120)
        prom.wait_value(f"sum(dankserve_restarts_total{{{on}}})", 1.0)
        prom.wait_value(f'dankserve_restarts_total{{{on},cause="engine_dead"}}', 1.0)
        prom.wait_value(f'dankserve_boots_total{{{on},kind="learned_bytes"}}', 1.0)
        prom.wait_value(f"dankserve_kv_cache_learned_used{{{on}}}", 1.0)
        prom.wait_value(f"dankserve_compile_cache_hits_total{{{on}}}", 1.0)
        status = daemon.wait_for(deployment, lambda d: d.get("serving") is not None, timeout=30)
        assert status["restarts_by_cause"] == {"engine_dead": 1}
        assert status["boots_by_kind"] == {"cold": 1, "learned_bytes": 1}
        assert status["serving"]["requests_waiting"] == 0
        # dankserve's own probes stay out of the server's access log.
        server_log = podman_env.podman("logs", workload_name(deployment)).stdout
        assert "GET /health" not in server_log and "GET /metrics" not in server_log
        assert daemon.stop() == 0


def test_hung_engine_is_caught_by_the_token_probe(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, vllm_image: str, deployment: str
) -> None:
    """An idle engine that hangs with /health 200 fails two one-token probes: engine_hung, restarted, evidence
    in last_failure."""
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])
    # After READY (the warm-up before it must not meet the hang): the probes find it.
    config = deployment_config(vllm_image, FAKE_VLLM_FAIL="engine_hung", FAKE_VLLM_FAIL_AFTER_SECONDS="3")
    settings = {
        "podman_url": podman_env.url,
        "liveness_interval_seconds": 1.0,
        "liveness_timeout_seconds": 1.0,
        "stall_seconds": 600.0,
        "serving_scrape_interval_seconds": 0.5,
    }
    with running_daemon(tmp_path, {deployment: config}, hardware=host, extra_globals=settings) as daemon:
        daemon.wait_for(deployment, ready, timeout=120)
        status = daemon.wait_for(deployment, lambda d: d["restarts"] >= 1, timeout=120)
        failure = status["last_failure"]
        assert failure["class"] == "engine_hung"
        assert "one-token completion failed 2 times" in failure["message"]
        assert status["restarts_by_cause"].get("engine_hung", 0) >= 1
        events = [e for e in daemon.events() if e.get("event") == "engine_hung"]
        assert events and "one-token completion" in events[0]["evidence"]
        assert daemon.stop() == 0


def test_hung_engine_with_waiting_requests_is_caught_by_stall_detection(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, vllm_image: str, deployment: str
) -> None:
    """Requests waiting while vLLM's token counters stand still for stall_seconds: engine_hung with the numbers."""
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])
    # The hang begins after READY: a hang before it stalls the warm-up, and that fails the boot instead.
    config = deployment_config(vllm_image, FAKE_VLLM_FAIL="engine_hung", FAKE_VLLM_FAIL_AFTER_SECONDS="3")
    settings = {
        "podman_url": podman_env.url,
        "liveness_interval_seconds": 0,
        "stall_seconds": 2.0,
        "serving_scrape_interval_seconds": 0.5,
    }
    with running_daemon(tmp_path, {deployment: config}, hardware=host, extra_globals=settings) as daemon:
        daemon.wait_for(deployment, ready, timeout=120)
        url = f"http://127.0.0.1:{config['port']}/v1/completions"
        body = json.dumps({"model": "test/tiny", "prompt": "hi", "max_tokens": 4}).encode()

        done = threading.Event()

        def ask() -> None:  # asks again and again: once the engine hangs, each client's request waits
            request = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
            while not done.is_set():
                with contextlib.suppress(OSError, urllib.error.URLError):
                    urllib.request.urlopen(request, timeout=60).read()
                done.wait(0.05)

        clients = [threading.Thread(target=ask, daemon=True) for _ in range(3)]
        for client in clients:
            client.start()
        status = daemon.wait_for(deployment, lambda d: d["restarts"] >= 1, timeout=120)
        failure = status["last_failure"]
        assert failure["class"] == "engine_hung"
        done.set()
        assert "3 requests waiting" in failure["message"] and "no token processed" in failure["message"]
        for client in clients:
            client.join(timeout=60)
        assert daemon.stop() == 0
