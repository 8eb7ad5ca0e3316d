"""Containers killed with SIGKILL at random boot phases: each comes back, never two at once, state intact."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from dankserve.runtime.base import workload_name
from tests.harness.daemon import container_deployment, free_port, running_daemon
from tests.harness.faults import (
    ContainerWatch,
    FaultTally,
    boot_reached,
    cycles,
    is_ready,
    read_state,
    reproduce,
    tally,
)
from tests.harness.podman_service import PodmanEnv

pytestmark = [pytest.mark.reliability, pytest.mark.slow, pytest.mark.timeout(1800)]

TARGETS = ("loading", "compiling", "ready")
SEED = 20261129


def test_containers_killed_at_random_phases_always_come_back(
    *,
    tmp_path: Path,
    podman_env: PodmanEnv,
    vllm_image: str,
    stand_in_host: Path,
    podman_globals: dict[str, Any],
    deployments: list[str],
) -> None:
    """Every container killed while loading, compiling or ready is replaced by exactly one new boot; the state
    file parses after every cycle and counts every boot and restart."""
    name = deployments[0]
    rng = random.Random(SEED)
    count = cycles("container_kill")
    record = FaultTally(
        "01-container-kill",
        "container killed (`podman kill`, SIGKILL) at a random boot phase: loading, compiling or ready",
        "a new container boots (the last one to ready); at most one container per deployment at every "
        "`podman ps`; state.json parses after every cycle with boots and restarts counted",
        reproduce("tests/reliability/test_container_kills.py"),
    )
    # A slower stand-in than the default tests' (cold boot about 6 s) so each phase lasts long enough to hit.
    dep = container_deployment(vllm_image, free_port(), gpus=[0], env={"FAKE_VLLM_TIME_SCALE": "0.05"})
    with (
        tally(record),
        running_daemon(tmp_path, {name: dep}, hardware=stand_in_host, extra_globals=podman_globals) as daemon,
        ContainerWatch(podman_env, (name,)) as watch,
    ):
        boot = 1
        for cycle in range(count):
            target = rng.choice(TARGETS)
            status = daemon.wait_for(name, boot_reached(target, boot=boot), timeout=120)
            killed = podman_env.podman("kill", workload_name(name), check=False)
            if killed.returncode != 0:  # it ended by itself meanwhile: no fault injected; look again
                continue
            record.inject(f"killed while {status['phase']}")
            assert len(watch.sample()[name]) <= 1
            try:
                after = daemon.wait_for(name, boot_reached("loading", boot=boot + 1), timeout=120)
            except AssertionError as exc:
                record.lose(f"cycle {cycle}: no new boot after the kill: {str(exc)[:300]}")
                break
            boot += 1
            state = read_state(daemon.state_dir).deployment(name)
            if state.boots != boot or after["restarts"] != cycle + 1 or state.restarts != cycle + 1:
                record.lose(f"cycle {cycle}: counts off: state boots {state.boots}, restarts {state.restarts}")
                continue
            record.recover()
        final = daemon.wait_for(name, is_ready, timeout=120)
        assert final["boots"] == boot
        assert read_state(daemon.state_dir).deployment(name).boots == boot
        assert len(watch.sample()[name]) == 1
        assert daemon.stop() == 0
        assert watch.sample()[name] == []
    record.notes.append(f"{watch.samples} `podman ps` samples, at most {watch.max_seen} container(s) at once")
    assert watch.breaches == []
    record.check()
