"""The Podman service stopped and started again while the daemon supervises: the daemon reconnects, and the
deployment serves again (and is supervised again: a container killed afterwards is replaced)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dankserve.backend_address import TcpAddress
from dankserve.supervisor.probes.health import check_health
from tests.harness.daemon import RunningDaemon, container_deployment, free_port, running_daemon
from tests.harness.faults import (
    ContainerWatch,
    FaultTally,
    boot_reached,
    cycles,
    is_ready,
    ready_after,
    reproduce,
    tally,
)
from tests.harness.podman_service import PodmanEnv, RestartableService
from tests.harness.wait import first_problem

pytestmark = [pytest.mark.reliability, pytest.mark.slow, pytest.mark.timeout(1800)]

OUTAGE_SECONDS = 6.0
VARIANTS = ("while ready (SIGTERM)", "while ready (SIGKILL)", "while booting", "container died during it")


@pytest.fixture
def service(podman_env: PodmanEnv, tmp_path: Path) -> Iterator[RestartableService]:
    """A Podman service of its own for the daemon, which the test stops and starts."""
    started = RestartableService(podman_env, tmp_path / "outage-podman")
    started.start()
    yield started
    started.stop()


def supervised_again(daemon: RunningDaemon, env: PodmanEnv, name: str) -> bool:
    """The daemon notices a container killed now and boots a new one to ready."""
    boots = daemon.wait_for(name, is_ready, timeout=120)["boots"]
    env.podman("kill", f"dankserve-{name}")
    daemon.wait_for(name, ready_after(boots), timeout=120)
    return True


def _outage_watch(
    daemon: RunningDaemon, podman_env: PodmanEnv, name: str, port: int, variant: str
) -> Callable[[], str | None]:
    """One look during an outage: the first problem seen, or None; kills the container 4 s before the
    outage ends where the variant says so."""
    deadline = time.monotonic() + OUTAGE_SECONDS
    killed = False

    def look() -> str | None:
        nonlocal killed
        if daemon.proc is None or daemon.proc.poll() is not None:
            return "the daemon exited"
        status = daemon.deployment(name)
        if status is not None and status["state"] == "failed":
            return f"failed during the outage: {status.get('message')}"
        if variant.startswith("while ready") and not check_health(TcpAddress("127.0.0.1", port)).healthy:
            return "the server stopped answering during the outage"
        if variant == "container died during it" and not killed and time.monotonic() > deadline - 4:
            podman_env.podman("kill", f"dankserve-{name}")
            killed = True
        return None

    return look


def test_podman_outages_are_survived(
    *,
    tmp_path: Path,
    podman_env: PodmanEnv,
    vllm_image: str,
    stand_in_host: Path,
    podman_globals: dict[str, Any],
    deployments: list[str],
    service: RestartableService,
) -> None:
    """Whenever the Podman service goes away for a while (stopped or killed; the deployment ready or booting; its
    container dying meanwhile), the daemon keeps running, the server keeps answering where it was up, and once
    Podman is back the deployment is ready and supervised again."""
    name = deployments[0]
    record = FaultTally(
        "03-podman-outage",
        f"the Podman service stopped for {OUTAGE_SECONDS:g} s and started again (SIGTERM or SIGKILL; the deployment "
        "ready or booting; or its container killed during the outage)",
        "the daemon stays up, the server answers /health during the outage where it was ready, the deployment "
        "is never `failed`; after the service returns it is ready again and a container killed then is "
        "replaced (supervision resumed); at most one container at any `podman ps`",
        reproduce("tests/reliability/test_podman_outage.py"),
    )
    port = free_port()
    dep = container_deployment(vllm_image, port, gpus=[0], env={"FAKE_VLLM_TIME_SCALE": "0.05"})
    globals_ = {**podman_globals, "podman_url": service.url}
    with (
        tally(record),
        running_daemon(tmp_path, {name: dep}, hardware=stand_in_host, extra_globals=globals_) as daemon,
        ContainerWatch(podman_env, (name,)) as watch,
    ):
        daemon.wait_for(name, is_ready, timeout=120)
        for cycle in range(cycles("podman_outage")):
            for variant in VARIANTS:
                if variant == "while booting":
                    boots = daemon.wait_for(name, is_ready, timeout=120)["boots"]
                    podman_env.podman("kill", f"dankserve-{name}")
                    daemon.wait_for(name, boot_reached("starting", after=boots), timeout=120)
                else:
                    daemon.wait_for(name, is_ready, timeout=120)
                service.stop(signal.SIGKILL if "SIGKILL" in variant else signal.SIGTERM)
                record.inject(variant)
                # the outage's length is the fault: watched the whole time, the first problem ends it
                problem = first_problem(_outage_watch(daemon, podman_env, name, port, variant), OUTAGE_SECONDS, 0.5)
                service.start()
                if problem is not None:
                    record.lose(f"cycle {cycle}, {variant}: {problem}")
                    break
                try:
                    # Ready, and no word of Podman being unreachable: the daemon has reconnected.
                    daemon.wait_for(name, lambda d: is_ready(d) and not d["message"], timeout=120)
                    supervised_again(daemon, podman_env, name)
                except AssertionError as exc:
                    record.lose(f"cycle {cycle}, {variant}: not back: {str(exc)[:400]}")
                    break
                record.recover()
        assert daemon.stop() == 0
        assert watch.sample()[name] == []
    record.notes.append(f"{watch.samples} `podman ps` samples, at most {watch.max_seen} container(s) at once")
    assert watch.breaches == []
    record.check()
