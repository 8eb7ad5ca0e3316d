"""Swap groups in a real daemon, on the real Podman service, with the stand-in vLLM's sleep mode."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dankserve.runtime.base import workload_name
from dankserve.supervisor.sleep_mode import available_ram_bytes
from tests.harness.daemon import MODEL_FACTS, RunningDaemon, free_port, running_daemon, write_host
from tests.harness.gpus import StandInGpus
from tests.harness.podman_service import PodmanEnv

pytestmark = [pytest.mark.slow, pytest.mark.podman]

BIG_WEIGHTS = 60_000_000_000
"""Weights no dev box's RAM holds beside the reserve: that member sleeps at level 2."""


@pytest.fixture
def members(podman_env: PodmanEnv, deployment: str) -> Iterator[list[str]]:
    names = [f"{deployment}-a", f"{deployment}-b", f"{deployment}-c"]
    yield names
    for name in names:
        podman_env.podman("rm", "-f", "-t", "0", workload_name(name), check=False)


def _member(image: str, model: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": f"test/{model}",
        "served_model_name": model,
        "image": image,
        "pull": "never",
        "port": free_port(),
        "gpus": [0],
        "gpu_memory_utilization": 0.9,
        "swap_group": "g",
        "env": {"FAKE_VLLM_TIME_SCALE": "0.02"},
        "model_facts": MODEL_FACTS,
        **extra,
    }


def _cli(daemon: RunningDaemon, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "dankserve", "--config", str(daemon.config), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def test_sleep_and_wake_refuse_what_is_not_a_running_swap_member(tmp_path: Path) -> None:
    """Outside a swap group: exit 2 naming the setting; a member without a running daemon: exit 3."""
    from dankserve.testing.config_file import write_config

    config = write_config(
        tmp_path / "dankserve.toml",
        {"state_dir": str(tmp_path / "state")},
        {"solo": {"model": "m", "port": free_port()}, "member": _member("localhost/vllm:test", "mm")},
    )
    argv = [sys.executable, "-m", "dankserve", "--config", str(config)]
    outside = subprocess.run([*argv, "wake", "solo"], capture_output=True, text=True, timeout=60, check=False)
    assert outside.returncode == 2 and "swap_group" in outside.stderr
    no_daemon = subprocess.run([*argv, "sleep", "member"], capture_output=True, text=True, timeout=60, check=False)
    assert no_daemon.returncode == 3 and "not running" in no_daemon.stderr


def _state(daemon: RunningDaemon, name: str) -> dict[str, Any]:
    status = daemon.deployment(name)
    assert status is not None
    return status


def test_a_swap_group_sleeps_and_wakes_its_members_through_the_gateway(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, vllm_image: str, members: list[str]
) -> None:
    """Three members at 0.9 on one GPU: the first stays awake after start-up, the others sleep
    (level 1, level 2 by RAM, and stopped where /is_sleeping is 404); a request for a sleeping
    one puts the awake one to sleep and wakes it; idle sleep; `sleep` and `wake` by hand."""
    a, b, c = members
    deployments = {
        a: _member(vllm_image, "ma", model_facts={**MODEL_FACTS, "parameter_bytes": BIG_WEIGHTS}),
        b: _member(vllm_image, "mb", idle_sleep_seconds=2),
        # Dev mode off: /is_sleeping answers 404, so this member sleeps by being stopped.
        c: _member(vllm_image, "mc", env={"FAKE_VLLM_TIME_SCALE": "0.02", "VLLM_SERVER_DEV_MODE": "0"}),
    }
    gateway_port = free_port()
    url = f"http://127.0.0.1:{gateway_port}/v1/chat/completions"
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])
    globals_ = {"podman_url": podman_env.url, "gateway": {"listen": f"127.0.0.1:{gateway_port}"}}
    ram = available_ram_bytes() or 0
    with running_daemon(tmp_path, deployments, hardware=host, extra_globals=globals_) as daemon:
        # Start-up: b and c boot first, one at a time, and are put to sleep; a boots last and stays awake.
        daemon.wait_for(a, lambda d: d["state"] == "ready", timeout=180)
        asleep_b = daemon.wait_for(b, lambda d: d["state"] == "asleep", timeout=30)
        asleep_c = daemon.wait_for(c, lambda d: d["state"] == "asleep", timeout=30)
        assert asleep_b["swap"]["level"] == "1" and asleep_b["swap"]["last_sleep_seconds"] is not None
        assert asleep_c["swap"]["level"] == "stop", "no dev-mode routes: stopped instead"
        assert podman_env.podman("ps", "-q", "--filter", f"name=^{workload_name(c)}$").stdout.strip() == ""

        # A request for b: a (the least recently used awake member) falls asleep, b wakes and answers.
        reply = httpx.post(url, json={"model": "mb", "messages": [{"role": "user", "content": "hi"}]}, timeout=60)
        assert reply.status_code == 200, reply.text
        slept_a = daemon.wait_for(a, lambda d: d["state"] == "asleep", timeout=10)
        assert slept_a["swap"]["level"] == ("2" if ram < BIG_WEIGHTS else "1")
        woke_b = _state(daemon, b)  # ready, or already asleep again on a loaded machine (idle for 2 s)
        assert woke_b["swap"]["last_wake_seconds"] is not None and woke_b["swap"]["last_level"] is not None

        # b sleeps after 2 s without requests.
        idle = daemon.wait_for(b, lambda d: d["state"] == "asleep", timeout=30)
        assert idle["swap"]["last_wake_seconds"] == woke_b["swap"]["last_wake_seconds"], "no wake since"
        assert any(e.get("event") == "swap_sleep" and "idle" in str(e.get("reason")) for e in daemon.events())

        # c, stopped to sleep, wakes by booting.
        reply = httpx.post(url.replace("chat/", ""), json={"model": "mc", "prompt": "hi"}, timeout=120)
        assert reply.status_code == 200, reply.text
        assert _state(daemon, c)["boots"] == 2

        # By hand, through the CLI: wake a (c makes room), put it to sleep again (twice: nothing to do).
        woken = _cli(daemon, "wake", a, "--json")
        assert woken.returncode == 0, woken.stderr
        assert json.loads(woken.stdout)["state"] == "ready" and _state(daemon, c)["state"] == "asleep"
        slept = _cli(daemon, "sleep", a)
        assert slept.returncode == 0 and f"{a}: asleep" in slept.stdout, slept.stderr
        assert _cli(daemon, "sleep", a).returncode == 0
        events = [e.get("event") for e in daemon.events()]
        assert {"fell_asleep", "woke_up", "swap_sleep", "swap_wake"} <= set(events)
