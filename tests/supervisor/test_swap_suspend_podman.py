"""Zero-residual sleep (issue 41 item 7) in a real daemon on the real Podman service with the stand-in image:
the GPU holders are found in the container by their host pids (the engine core, a child of the API server),
so a pair on one GPU takes turns suspended as on the process runtime: the sleeper's container holds 0 bytes
(its NVML records, in the mounted HF cache beside the recorded host), and each wake answers the same greedy
ids as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dankserve.runtime.base import CONTAINER_HF_HOME
from tests.harness.daemon import free_port, running_daemon, write_host
from tests.harness.gpus import StandInGpus
from tests.harness.podman_service import PodmanEnv
from tests.supervisor.test_swap_podman import _member as swap_member
from tests.supervisor.test_swap_podman import members
from tests.supervisor.test_swap_suspend_process import _complete

__all__ = ["members"]  # the fixture: three member names, their containers removed after

pytestmark = [pytest.mark.slow, pytest.mark.podman]


def test_containers_take_turns_suspended_the_sleeper_holding_0_bytes(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, vllm_image: str, members: list[str]
) -> None:
    a, b, _ = members
    (tmp_path / "hf").mkdir()
    host = write_host(tmp_path / "hf" / "host.json", uuids=[g.uuid for g in gpus.gpus])
    records = f"{CONTAINER_HF_HOME}/host.json.processes"  # the same directory, as the container sees it
    env: dict[str, Any] = {"FAKE_VLLM_TIME_SCALE": "0.02", "FAKE_VLLM_NVML_DIR": records}
    deployments = {
        a: swap_member(vllm_image, "ma", sleep_level="suspend", env=env),
        b: swap_member(vllm_image, "mb", sleep_level="suspend", env=env),
    }
    gateway = free_port()
    url = f"http://127.0.0.1:{gateway}"
    globals_ = {"podman_url": podman_env.url, "gateway": {"listen": f"127.0.0.1:{gateway}"}}
    with running_daemon(tmp_path, deployments, hardware=host, extra_globals=globals_) as daemon:
        daemon.wait_for(a, lambda d: d["state"] == "ready", timeout=180)
        asleep = daemon.wait_for(b, lambda d: d["state"] == "asleep", timeout=60)
        assert asleep["swap"]["level"] == "suspend" and asleep["gpu_memory_held_bytes"] == 0
        first_a = _complete(url, "ma")
        first_b = _complete(url, "mb")
        slept = daemon.wait_for(a, lambda d: d["state"] == "asleep", timeout=60)
        assert slept["swap"]["level"] == "suspend" and slept["gpu_memory_held_bytes"] == 0
        assert _complete(url, "ma") == first_a
        assert _complete(url, "mb") == first_b
        assert [e["deployment"] for e in daemon.events_named("wake_verified")] == [b, a, b]
