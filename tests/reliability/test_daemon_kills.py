"""The daemon killed with -9 at random phases, then started again: it adopts or replaces each container,
never two containers for one deployment, never one GPU in two deployments' containers."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from tests.harness.daemon import container_deployment, free_port, running_daemon
from tests.harness.faults import (
    ContainerWatch,
    FaultTally,
    boot_reached,
    cycles,
    gpu_devices_of,
    is_ready,
    read_state,
    reproduce,
    tally,
)
from tests.harness.podman_service import PodmanEnv
from tests.harness.wait import hold_for

pytestmark = [pytest.mark.reliability, pytest.mark.slow, pytest.mark.timeout(1800)]

TARGETS = ("starting", "loading", "compiling", "ready")
SEED = 4242


def test_daemon_killed_with_9_at_random_phases_adopts_or_replaces(
    *,
    tmp_path: Path,
    podman_env: PodmanEnv,
    vllm_image: str,
    stand_in_host: Path,
    podman_globals: dict[str, Any],
    deployments: list[str],
) -> None:
    """After each kill -9 of the daemon the next one brings both deployments to ready by adopting or replacing
    their containers; at no sample does a deployment have two containers or a GPU two deployments."""
    first = deployments[0]
    second = f"{first}-b"
    deployments.append(second)
    rng = random.Random(SEED)
    count = cycles("daemon_kill")
    record = FaultTally(
        "02-daemon-kill",
        "the daemon killed with SIGKILL at a random phase of a deployment's boot (starting, loading, "
        "compiling, ready), then started again; two deployments, one GPU each",
        "the new daemon brings both deployments to ready, adopting each running container with the same "
        "fingerprint or replacing it; at most one container per deployment and no GPU in two deployments' "
        "running containers at any `podman ps` sample; state.json parses",
        reproduce("tests/reliability/test_daemon_kills.py"),
    )
    specs = {
        first: container_deployment(vllm_image, free_port(), gpus=[0], env={"FAKE_VLLM_TIME_SCALE": "0.05"}),
        second: container_deployment(vllm_image, free_port(), gpus=[1], env={"FAKE_VLLM_TIME_SCALE": "0.05"}),
    }
    with (
        tally(record),
        running_daemon(tmp_path, specs, hardware=stand_in_host, extra_globals=podman_globals) as daemon,
        ContainerWatch(podman_env, (first, second), check_gpus=True) as watch,
    ):
        for cycle in range(count):
            target = rng.choice(TARGETS)
            victim = rng.choice((first, second))
            if target != "ready":
                # Make the victim boot again (its container killed), so the daemon dies during that boot.
                boots = daemon.wait_for(victim, is_ready, timeout=120)["boots"]
                podman_env.podman("kill", f"dankserve-{victim}", check=False)
                status = daemon.wait_for(victim, boot_reached(target, after=boots), timeout=120)
            else:
                status = daemon.wait_for(victim, is_ready, timeout=120)
            hold_for(rng.uniform(0, 0.2), "a random moment into the phase, so kills land at varied points")
            before = {name: {c["Id"] for c in watch.sample()[name]} for name in (first, second)}
            daemon.kill()
            record.inject(f"killed while {'a' if victim == first else 'b'} was {status['phase']}")
            if rng.random() < 0.3:
                # Its container dies too while no daemon watches: the next daemon must replace it.
                podman_env.podman("kill", f"dankserve-{victim}", check=False)
                record.breakdown["victim's container killed too"] += 1
            after_kill = watch.sample()
            assert all(len(listed) <= 1 for listed in after_kill.values())
            daemon.start()
            try:
                for name in (first, second):
                    daemon.wait_for(name, is_ready, timeout=120)
            except AssertionError as exc:
                record.lose(f"cycle {cycle}: not ready again after the restart: {str(exc)[:400]}")
                break
            seen = watch.sample()
            if any(len(listed) != 1 for listed in seen.values()):
                record.lose(f"cycle {cycle}: containers after recovery: { {n: len(v) for n, v in seen.items()} }")
                continue
            for name in (first, second):
                kept = {c["Id"] for c in seen[name]} == before[name]
                record.breakdown["container adopted" if kept else "container replaced"] += 1
            read_state(daemon.state_dir)  # parses
            record.recover()
        # The GPU check means something only if the containers' GPUs can be seen.
        seen = watch.sample()
        assert gpu_devices_of(seen[first][0]) == {"nvidia0"}
        assert gpu_devices_of(seen[second][0]) == {"nvidia1"}
        assert daemon.stop() == 0
        assert all(listed == [] for listed in watch.sample().values())
    record.notes.append(f"{watch.samples} `podman ps` samples, at most {watch.max_seen} container(s) per deployment")
    assert watch.breaches == []
    record.check()
