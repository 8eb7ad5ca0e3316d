"""Fixtures of the fault-injection suite: dankserve daemons supervising stand-in containers on real Podman.

Every module here marks its tests `reliability` (and `slow`); the default run deselects them
(tests/conftest.py), `make reliability` selects them. Restarts are fast and never give up in
these configurations (many failures are the point), so each fault shows recovery, not policy.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.daemon import write_host
from tests.harness.faults import remove_deployment_containers
from tests.harness.gpus import StandInGpus
from tests.harness.podman_service import PodmanEnv

# Fast restarts that never end in `failed`: the suite injects far more faults than the default window allows.
RELIABLE_GLOBALS: dict[str, Any] = {
    "restart_backoff_initial_seconds": 0.2,
    "restart_backoff_max_seconds": 1.0,
    "restart_jitter_seconds": 0.1,
    "max_failures_in_window": 100_000,
    "health_interval_seconds": 1.0,
    "stop_timeout_seconds": 5.0,
}


@pytest.fixture
def stand_in_host(tmp_path: Path, gpus: StandInGpus) -> Path:
    """A recorded two-H200 host whose GPUs are the stand-in ones (their CDI names as UUIDs)."""
    return write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])


@pytest.fixture
def podman_globals(podman_env: PodmanEnv, tmp_path: Path) -> dict[str, Any]:
    """Daemon settings for the suite: the private Podman service, fast never-ending restarts, an HF cache."""
    (tmp_path / "hf").mkdir(exist_ok=True)  # running_daemon's hf_cache_dir: mounted, so it must exist
    return {**RELIABLE_GLOBALS, "podman_url": podman_env.url}


@pytest.fixture
def deployments(podman_env: PodmanEnv, deployment: str) -> Iterator[list[str]]:
    """Deployment names of this test (first `deployment`; add more); their containers removed after."""
    names = [deployment]
    yield names
    remove_deployment_containers(podman_env, names)
