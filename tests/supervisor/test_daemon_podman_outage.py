"""The daemon on real Podman while the Podman service goes away and comes back (regression: a lost log stream
or an unreachable service used to fail the deployment for good). tests/reliability repeats this at volume."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from dankserve.backend_address import TcpAddress
from dankserve.supervisor.probes.health import check_health
from tests.harness.daemon import RunningDaemon, container_deployment, free_port, running_daemon, write_host
from tests.harness.faults import boot_reached, is_ready, ready_after
from tests.harness.gpus import StandInGpus
from tests.harness.podman_service import PodmanEnv, RestartableService
from tests.harness.wait import hold_for, stays_true

pytestmark = pytest.mark.slow


def stand_in_host(tmp_path: Path, gpus: StandInGpus) -> Path:
    """The recorded host of the stand-in GPUs, and the HF cache directory the daemon's config names."""
    (tmp_path / "hf").mkdir()
    return write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])


@pytest.fixture
def service(podman_env: PodmanEnv, tmp_path: Path) -> Iterator[RestartableService]:
    started = RestartableService(podman_env, tmp_path / "outage-podman")
    started.start()
    yield started
    started.stop()


def test_a_podman_outage_neither_fails_nor_stops_the_deployment(
    *,
    tmp_path: Path,
    podman_env: PodmanEnv,
    gpus: StandInGpus,
    vllm_image: str,
    deployment: str,
    service: RestartableService,
) -> None:
    """With the Podman service killed the server keeps answering and the deployment stays ready; once it is back
    the daemon follows the same container again, and a container that died meanwhile is replaced."""
    host = stand_in_host(tmp_path, gpus)
    port = free_port()
    globals_ = {"podman_url": service.url, "restart_backoff_max_seconds": 1.0}
    dep = container_deployment(vllm_image, port, gpus=[0])
    with running_daemon(tmp_path, {deployment: dep}, hardware=host, extra_globals=globals_) as daemon:
        first = daemon.wait_for(deployment, is_ready, timeout=120)
        service.stop(signal.SIGKILL)
        stays_true(
            lambda: check_health(TcpAddress("127.0.0.1", port)).healthy and _state(daemon, deployment) == "ready",
            3,
            0.5,
            what="the server answering and the deployment ready with Podman gone",
        )
        service.start()
        daemon.wait_for(deployment, lambda d: is_ready(d) and not d["message"], timeout=60)
        # The same container, followed again (from its log file, or the API once it is back): no new boot.
        assert daemon.deployment(deployment)["boots"] == first["boots"]  # type: ignore[index]

        service.stop(signal.SIGTERM)
        podman_env.podman("kill", f"dankserve-{deployment}")
        daemon.wait_for(deployment, lambda d: d["state"] != "ready", timeout=30)
        stays_true(
            lambda: _state(daemon, deployment) != "failed",
            2,
            what="a container dead during the outage not failing the deployment",
        )
        service.start()
        daemon.wait_for(deployment, ready_after(first["boots"]), timeout=120)
        after = daemon.deployment(deployment) or {}
        assert boot_reached("ready", after=first["boots"])(after)
        # the death during the outage is counted as any death is (issue 39, low): a restart and its failure
        assert after["restarts"] == first["restarts"] + 1 and after["last_failure"] is not None, after
        assert daemon.stop() == 0


def _state(daemon: RunningDaemon, deployment: str) -> str | None:
    shown = daemon.deployment(deployment)
    return None if shown is None else str(shown["state"])


PAUSE_SECONDS = 70.0
"""Longer than the daemon's Podman request timeout (60 s): the request waiting on the paused service fails."""


def test_a_paused_podman_service_in_a_boot_and_a_stop_is_waited_out(
    *, tmp_path: Path, gpus: StandInGpus, vllm_image: str, deployment: str, service: RestartableService
) -> None:
    """Podman paused (SIGSTOP) while a boot asks for its image, and while a restart stops the server: the request
    that outlives the timeout is transient, so the deployment waits (never `failed`); once Podman is resumed
    (SIGCONT) it is ready again (regression: a Podman timeout failed the deployment for good)."""
    host = stand_in_host(tmp_path, gpus)
    globals_ = {"podman_url": service.url, "restart_backoff_max_seconds": 1.0, "stop_timeout_seconds": 2.0}
    dep = container_deployment(vllm_image, free_port(), gpus=[0])
    with running_daemon(tmp_path, {deployment: dep}, hardware=host, extra_globals=globals_) as daemon:
        boots = daemon.wait_for(deployment, is_ready, timeout=120)["boots"]
        assert daemon.cli("down", deployment).returncode == 0
        for move in ("up", "restart"):  # a boot asking for the image; a stop of the ready server
            service.pause()
            try:
                daemon.cli(move, deployment, "--timeout", "2")
                hold_for(PAUSE_SECONDS, "Podman stays paused past the daemon's 60 s request timeout")
                assert daemon.deployment(deployment)["state"] != "failed"  # type: ignore[index]
            finally:
                service.resume()
            boots = daemon.wait_for(deployment, ready_after(boots), timeout=180)["boots"]
        assert daemon.stop() == 0
