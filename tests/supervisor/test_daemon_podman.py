"""End-to-end tests of the daemon on the real Podman service with the stand-in vLLM image.

The container path is the product: first boot learns, a killed container restarts warm, a
daemon killed with -9 is succeeded by one that adopts the container, SIGTERM leaves nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dankserve.runtime.base import LABEL_DEPLOYMENT, workload_name
from tests.harness.daemon import MODEL_FACTS, free_port, running_daemon, write_host
from tests.harness.gpus import StandInGpus
from tests.harness.podman_service import PodmanEnv

pytestmark = pytest.mark.slow


def ready(d: dict[str, Any]) -> bool:
    return bool(d["state"] == "ready")


def containers_of(env: PodmanEnv, deployment: str) -> list[dict[str, Any]]:
    done = env.podman("ps", "-a", "--format", "json", "--filter", f"label={LABEL_DEPLOYMENT}={deployment}")
    out: list[dict[str, Any]] = json.loads(done.stdout or "[]")
    return out


def container_args(env: PodmanEnv, name: str) -> list[str]:
    inspected = json.loads(env.podman("inspect", name).stdout)[0]
    args: list[str] = inspected["Args"]
    return args


@pytest.fixture
def container_deployment(podman_env: PodmanEnv, vllm_image: str, deployment: str) -> dict[str, Any]:
    return {
        "model": "test/tiny",
        "image": vllm_image,
        "pull": "never",
        # A restart here is a boot of a new container: no snapshot, no launcher (their own tests:
        # test_daemon_snapshots_podman.py, test_daemon_podman_launcher.py).
        "snapshot": "off",
        "launcher": False,
        "port": free_port(),
        "gpus": [0],
        "env": {"FAKE_VLLM_TIME_SCALE": "0.02"},
        "model_facts": MODEL_FACTS,
    }


def test_container_learns_then_restarts_warm_and_sigterm_leaves_nothing(
    tmp_path: Path,
    podman_env: PodmanEnv,
    gpus: StandInGpus,
    deployment: str,
    container_deployment: dict[str, Any],
) -> None:
    """First boot learns the KV bytes; a killed container comes back with them and a compile-cache hit; SIGTERM
    removes it."""
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])
    with running_daemon(
        tmp_path, {deployment: container_deployment}, hardware=host, extra_globals={"podman_url": podman_env.url}
    ) as daemon:
        first = daemon.wait_for(deployment, ready, timeout=120)
        assert first["compile_cache_hit"] is False and first["kv_cache_learned_used"] is False
        learned = first["kv_cache_memory_bytes"]
        assert learned
        assert "--kv-cache-memory-bytes" not in container_args(podman_env, workload_name(deployment))
        podman_env.podman("kill", workload_name(deployment))
        second = daemon.wait_for(deployment, lambda d: ready(d) and d["boots"] == 2, timeout=120)
        assert second["kv_cache_learned_used"] is True and second["compile_cache_hit"] is True
        args = container_args(podman_env, workload_name(deployment))
        assert args[args.index("--kv-cache-memory-bytes") + 1] == str(learned)
        assert len(containers_of(podman_env, deployment)) == 1
        assert daemon.stop() == 0
        assert containers_of(podman_env, deployment) == []


def test_daemon_killed_with_9_is_succeeded_by_one_that_adopts_the_container(
    tmp_path: Path,
    podman_env: PodmanEnv,
    gpus: StandInGpus,
    deployment: str,
    container_deployment: dict[str, Any],
) -> None:
    """After kill -9 of the daemon the container keeps serving; the next daemon adopts it: one container, no
    reboot."""
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])
    with running_daemon(
        tmp_path, {deployment: container_deployment}, hardware=host, extra_globals={"podman_url": podman_env.url}
    ) as daemon:
        daemon.wait_for(deployment, ready, timeout=120)
        before = containers_of(podman_env, deployment)
        daemon.kill()
        daemon.start()
        status = daemon.wait_for(deployment, ready, timeout=120)
        after = containers_of(podman_env, deployment)
        assert [c["Id"] for c in after] == [c["Id"] for c in before]
        assert status["boots"] == 1
        assert daemon.stop() == 0
        assert containers_of(podman_env, deployment) == []


def test_unreachable_podman_is_an_environment_error(tmp_path: Path, container_deployment: dict[str, Any]) -> None:
    """A daemon whose Podman socket does not answer exits 3 naming the URL, before supervising anything."""
    url = f"unix://{tmp_path}/nothing.sock"
    with running_daemon(tmp_path, {"chat": container_deployment}, extra_globals={"podman_url": url}) as daemon:
        assert daemon.proc is not None
        code = daemon.proc.wait(60)
        assert code == 3
        assert url in daemon.log_tail()
