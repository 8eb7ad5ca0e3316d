"""End-to-end tests of launcher boots on the real Podman service with the stand-in image.

The container's own python3 runs the launcher from the read-only mount; a crashed server is
replaced inside the same container; the container going away (its launcher with it) makes a new
one; `down`/`up` and a reload that keeps the container-level settings keep the container; kill -9
of the daemon is followed by adoption; SIGTERM leaves no container, not even the idle one of a
failed deployment.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from dankserve.runtime.base import LABEL_DEPLOYMENT, workload_name
from dankserve.runtime.launcher_client import LauncherClient
from dankserve.testing.config_file import write_config
from tests.harness.daemon import LAUNCHER_ENV, MODEL_FACTS, RunningDaemon, free_port, running_daemon, write_host
from tests.harness.gpus import StandInGpus
from tests.harness.podman_service import PodmanEnv

pytestmark = pytest.mark.slow


def ready(d: dict[str, Any]) -> bool:
    return bool(d["state"] == "ready")


def container_ids(env: PodmanEnv, deployment: str) -> list[str]:
    done = env.podman("ps", "-a", "--format", "json", "--filter", f"label={LABEL_DEPLOYMENT}={deployment}")
    return [c["Id"] for c in json.loads(done.stdout or "[]")]


def reload(daemon: RunningDaemon, deployment: str, dep: dict[str, Any]) -> None:
    """Rewrite the config with `dep` as the only deployment (same globals), then SIGHUP."""
    globals_text = daemon.config.read_text().split("[deployments.", 1)[0]
    write_config(daemon.config, {}, {deployment: dep})
    daemon.config.write_text(globals_text + daemon.config.read_text())
    daemon.signal(signal.SIGHUP)


def server_pid(daemon: RunningDaemon, deployment: str) -> int:
    """The server's pid in the container's PID namespace."""
    server = LauncherClient(daemon.state_dir / "launchers" / deployment).status().server
    assert server is not None and not server.exited
    return server.pid


@pytest.fixture
def launcher_deployment(podman_env: PodmanEnv, vllm_image: str, deployment: str) -> dict[str, Any]:
    return {
        "model": "test/tiny",
        "image": vllm_image,
        "pull": "never",
        "port": free_port(),
        "gpus": [0],
        "launcher": True,
        # The launcher's own behaviour: with snapshots a restart restores the whole container instead of asking
        # the launcher for a server (tests/supervisor/test_daemon_snapshots_podman.py tests that).
        "snapshot": "off",
        # No DANKSERVE_LAUNCHER_PATH: the image's own PYTHONPATH finds the stand-in, as an image's finds vLLM.
        "env": {"FAKE_VLLM_TIME_SCALE": "0.02", **LAUNCHER_ENV},
        "model_facts": MODEL_FACTS,
    }


def test_a_crashed_server_restarts_in_the_same_container_and_a_dead_container_is_replaced(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, deployment: str, launcher_deployment: dict[str, Any]
) -> None:
    """A server killed inside the container is replaced by the same launcher (same container, learned bytes); a
    killed container is replaced by a new one; SIGTERM leaves none."""
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])
    with running_daemon(
        tmp_path, {deployment: launcher_deployment}, hardware=host, extra_globals={"podman_url": podman_env.url}
    ) as daemon:
        first = daemon.wait_for(deployment, ready, timeout=120)
        assert first["kv_cache_learned_used"] is False
        (container,) = container_ids(podman_env, deployment)
        podman_env.podman("exec", workload_name(deployment), "sh", "-c", f"kill -9 {server_pid(daemon, deployment)}")
        second = daemon.wait_for(deployment, lambda d: ready(d) and d["boots"] == 2, timeout=120)
        assert second["kv_cache_learned_used"] is True and second["compile_cache_hit"] is True
        assert container_ids(podman_env, deployment) == [container]
        podman_env.podman("kill", workload_name(deployment))
        daemon.wait_for(deployment, lambda d: ready(d) and d["boots"] == 3, timeout=120)
        (replacement,) = container_ids(podman_env, deployment)
        assert replacement != container
        assert daemon.stop() == 0
        assert container_ids(podman_env, deployment) == []


def test_a_daemon_killed_with_9_is_followed_by_adoption_of_the_launchers_server(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, deployment: str, launcher_deployment: dict[str, Any]
) -> None:
    """After kill -9 of the daemon, the next one adopts the container's running server: no new server."""
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])
    with running_daemon(
        tmp_path, {deployment: launcher_deployment}, hardware=host, extra_globals={"podman_url": podman_env.url}
    ) as daemon:
        daemon.wait_for(deployment, ready, timeout=120)
        before = (container_ids(podman_env, deployment), server_pid(daemon, deployment))
        daemon.kill()
        daemon.start()
        status = daemon.wait_for(deployment, ready, timeout=120)
        assert (container_ids(podman_env, deployment), server_pid(daemon, deployment)) == before
        assert status["boots"] == 1
        assert daemon.stop() == 0
        assert container_ids(podman_env, deployment) == []


def test_down_up_and_a_reload_keep_the_container_unless_the_port_changes(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, deployment: str, launcher_deployment: dict[str, Any]
) -> None:
    """`down`/`up` and a changed max_num_seqs get new servers in the same container; a changed port a new one;
    SIGTERM after `down` leaves no container."""
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])
    with running_daemon(
        tmp_path, {deployment: launcher_deployment}, hardware=host, extra_globals={"podman_url": podman_env.url}
    ) as daemon:
        daemon.wait_for(deployment, ready, timeout=120)
        (container,) = container_ids(podman_env, deployment)
        assert daemon.request({"command": "down", "deployment": deployment}) == {"ok": True}
        assert container_ids(podman_env, deployment) == [container]
        assert daemon.request({"command": "up", "deployment": deployment}) == {"ok": True}
        daemon.wait_for(deployment, lambda d: ready(d) and d["boots"] == 2, timeout=120)
        assert container_ids(podman_env, deployment) == [container]
        reload(daemon, deployment, {**launcher_deployment, "max_num_seqs": 16})
        daemon.wait_for(deployment, lambda d: ready(d) and d["boots"] == 3, timeout=120)
        assert container_ids(podman_env, deployment) == [container]
        logs = podman_env.podman("logs", workload_name(deployment))
        assert "'max_num_seqs': 16" in (logs.stdout + logs.stderr).split("server 3 started", 1)[1]
        reload(daemon, deployment, {**launcher_deployment, "max_num_seqs": 16, "port": free_port()})
        daemon.wait_for(deployment, lambda d: ready(d) and d["boots"] == 4, timeout=120)
        (replacement,) = container_ids(podman_env, deployment)
        assert replacement != container
        assert daemon.request({"command": "down", "deployment": deployment}) == {"ok": True}
        assert daemon.stop() == 0
        assert container_ids(podman_env, deployment) == []


def test_a_server_is_forked_with_the_images_env_before_and_after_a_reload_that_drops_a_variable(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, deployment: str, launcher_deployment: dict[str, Any]
) -> None:
    """The stand-in is found only through the image's PYTHONPATH: the launcher's servers inherit it (forked, not a
    plain boot that fails to import), also after a reload that drops one of the deployment's variables."""
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])
    marked = {**launcher_deployment, "env": {**launcher_deployment["env"], "DANKSERVE_TEST_MARK": "1"}}
    with running_daemon(
        tmp_path, {deployment: marked}, hardware=host, extra_globals={"podman_url": podman_env.url}
    ) as daemon:
        daemon.wait_for(deployment, ready, timeout=120)
        (container,) = container_ids(podman_env, deployment)
        client = LauncherClient(daemon.state_dir / "launchers" / deployment)
        first = client.status().server
        assert first is not None and first.mode == "fork", first
        reload(daemon, deployment, launcher_deployment)
        daemon.wait_for(deployment, lambda d: ready(d) and d["boots"] == 2, timeout=120)
        second = client.status().server
        assert second is not None and second.mode == "fork" and second.id != first.id, second
        assert container_ids(podman_env, deployment) == [container]
        assert daemon.stop() == 0


def test_sigterm_removes_the_idle_launcher_container_of_a_failed_deployment(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, deployment: str, launcher_deployment: dict[str, Any]
) -> None:
    """A flag vLLM rejects fails the deployment (not restarted) while its launcher container idles on for `up`;
    SIGTERM removes that container too."""
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])
    bad = {**launcher_deployment, "extra_args": ["--max-num-seqz", "16"]}
    with running_daemon(
        tmp_path, {deployment: bad}, hardware=host, extra_globals={"podman_url": podman_env.url}
    ) as daemon:
        status = daemon.wait_for(deployment, lambda d: d["state"] == "failed", timeout=120)
        assert status["last_failure"]["class"] == "bad_argument"
        assert len(container_ids(podman_env, deployment)) == 1
        assert daemon.stop() == 0
        assert container_ids(podman_env, deployment) == []
