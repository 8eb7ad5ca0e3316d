"""Tests for dankserve.supervisor.observe.metrics: the exposition of one snapshot, served over HTTP, linted by
promtool."""

from __future__ import annotations

import shutil
import subprocess
import urllib.request

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from dankserve.gateway.usage import Counts
from dankserve.host.gpu_memory import GpuMemory
from dankserve.supervisor.observe.metrics import (
    EXPORTED,
    DeploymentFacts,
    MetricsServer,
    MetricsSnapshot,
    SnapshotCollector,
)
from dankserve.supervisor.observe.serving import RELAYED, parse_serving
from dankserve.supervisor.observe.telemetry import Telemetry
from tests.supervisor.test_serving import TEXT


def snapshot() -> MetricsSnapshot:
    telemetry = Telemetry()
    telemetry.track("chat")
    telemetry.booted("chat", "cold", 42.0, compile_cache_hit=False)
    telemetry.restarted("chat", "engine_hung")
    telemetry.swapped("nap", "sleep", 0.22)
    telemetry.slower_than_predicted("nap", "wake")
    deployments = (
        DeploymentFacts("chat", "ready", "ready", "org/m", "img:1", "0.33.0", 1 << 30, True, 12.0),
        DeploymentFacts("code", "down", "stopped", "org/c", "img:1"),
        DeploymentFacts("nap", "asleep", "asleep", "org/n", "img:1", swap_group="g", sleep_level="2"),
    )
    return MetricsSnapshot(
        deployments=deployments,
        telemetry=telemetry.snapshot(),
        serving={"chat": parse_serving(TEXT, at=0.0)},
        scrape_ok={"chat": True},
        gpus={"GPU-a": GpuMemory(0, "GPU-a", 80 << 30, 10 << 30, 70 << 30)},
        gateway={("alice", "qwen"): Counts({200: 3, 429: 1}, 10, 20), ("-", "-"): Counts({401: 2})},
    )


def exposition(shot: MetricsSnapshot) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: shot))
    return generate_latest(registry).decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_every_sample_is_an_exported_or_relayed_name() -> None:
    """Each sample in the exposition is one of EXPORTED, or a relayed vLLM family's."""
    relayed_prefixes = tuple(RELAYED)
    for name, _ in samples(exposition(snapshot())):
        assert name in EXPORTED or name.startswith(relayed_prefixes), name


def test_state_phase_and_counts_per_deployment() -> None:
    """State and phase are one-hot; boots, restarts and boot durations carry the deployment."""
    got = samples(exposition(snapshot()))
    assert got[("dankserve_deployment_state", (("deployment", "chat"), ("state", "ready")))] == 1.0
    assert got[("dankserve_deployment_state", (("deployment", "chat"), ("state", "failed")))] == 0.0
    assert got[("dankserve_deployment_state", (("deployment", "code"), ("state", "down")))] == 1.0
    assert got[("dankserve_boots_total", (("deployment", "chat"), ("kind", "cold")))] == 1.0
    assert got[("dankserve_restarts_total", (("cause", "engine_hung"), ("deployment", "chat")))] == 1.0
    assert got[("dankserve_restarts_total", (("cause", "crash"), ("deployment", "chat")))] == 0.0
    assert got[("dankserve_boot_duration_seconds_sum", (("deployment", "chat"), ("kind", "cold")))] == 42.0
    assert got[("dankserve_kv_cache_learned_used", (("deployment", "chat"),))] == 1.0
    assert got[("dankserve_gpu_memory_used_bytes", (("gpu", "0"), ("uuid", "GPU-a")))] == float(70 << 30)
    assert got[("dankserve_slower_than_predicted_total", (("deployment", "nap"), ("kind", "wake")))] == 1.0
    assert got[("dankserve_slower_than_predicted_total", (("deployment", "chat"), ("kind", "cold")))] == 0.0


def test_vllm_metrics_are_relayed_with_the_deployment() -> None:
    """vLLM's own series keep their names and labels and gain `deployment`."""
    got = samples(exposition(snapshot()))
    key = ("vllm:num_requests_waiting", (("deployment", "chat"), ("engine", "0"), ("model_name", "m")))
    assert got[key] == 4.0
    assert any(name == "vllm:time_to_first_token_seconds_bucket" for name, _ in got)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus package) is missing")
def test_promtool_finds_no_naming_problem() -> None:
    """promtool's linter accepts dankserve's own series (prefix, _total, _seconds, _bytes)."""
    own = "\n".join(line for line in exposition(snapshot()).splitlines() if "vllm:" not in line) + "\n"
    done = subprocess.run(["promtool", "check", "metrics"], input=own, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_server_answers_on_loopback() -> None:
    """MetricsServer serves the exposition over HTTP on its address and stops on close."""
    server = MetricsServer("127.0.0.1", 0, snapshot)
    server.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as response:
            body = response.read().decode()
        assert "dankserve_deployment_state" in body
        # A Prometheus asking for OpenMetrics still gets vLLM's colon names, not escaped ones.
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.port}/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert "vllm:num_requests_waiting{" in response.read().decode()
    finally:
        server.close()


def test_swap_group_members_show_their_sleep_state_and_swap_times() -> None:
    """A member asleep at level 2 reads 2; its sleep times are a histogram; others have no sleep series."""
    got = samples(exposition(snapshot()))
    assert got[("dankserve_sleep_state", (("deployment", "nap"), ("swap_group", "g")))] == 2.0
    assert got[("dankserve_swap_seconds_sum", (("deployment", "nap"), ("direction", "sleep")))] == 0.22
    assert got[("dankserve_swap_seconds_count", (("deployment", "nap"), ("direction", "wake")))] == 0.0
    assert not any(name == "dankserve_sleep_state" and dict(labels)["deployment"] == "chat" for name, labels in got)


def test_exported_names_are_exactly_what_a_full_snapshot_shows() -> None:
    """EXPORTED (which the dashboard test checks against) lists every own sample name, and no other."""
    own = {name for name, _ in samples(exposition(snapshot())) if not name.startswith("vllm:")}
    assert own == EXPORTED


def test_gateway_requests_and_tokens_by_key_name() -> None:
    """dankserve_gateway_requests_total{key,model,code} and tokens_total{key,model,kind} from the counters."""
    shown = samples(exposition(snapshot()))
    assert shown[("dankserve_gateway_requests_total", (("code", "429"), ("key", "alice"), ("model", "qwen")))] == 1
    assert shown[("dankserve_gateway_requests_total", (("code", "401"), ("key", "-"), ("model", "-")))] == 2
    assert (
        shown[("dankserve_gateway_tokens_total", (("key", "alice"), ("kind", "completion"), ("model", "qwen")))] == 20
    )
