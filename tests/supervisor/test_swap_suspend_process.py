"""Zero-residual sleep (issue 41 item 7) through a real daemon (subprocess) running the stand-in vLLM as plain
processes: a pair on one GPU takes turns with `sleep_level = "suspend"` (level 1, then the GPU checkpoint of
the engine core through the stand-in's checkpoint seam): the sleeper holds 0 bytes as the stand-in's NVML
records show, and each wake (GPU restore, unlock, vLLM's wake) answers the greedy ids it answered before its
first sleep. A failing GPU checkpoint (FAKE_VLLM_GPU_CHECKPOINT_FAIL) leaves the member asleep at plain level 1
with the reason; a suspended member killed with -9 is booted again normally; with `sleep_level = "auto"` a
GPU too small for the woken member beside a sleeper's leftovers suspends the sleeper."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness.daemon import RunningDaemon, free_port, process_deployment, running_daemon, write_host

pytestmark = pytest.mark.slow

MEMBER = {"gpus": [0], "gpu_memory_utilization": 0.9, "swap_group": "g"}


def _nvml_env(host: Path, **knobs: str) -> dict[str, str]:
    return {"FAKE_VLLM_NVML_DIR": str(host.with_name(host.name + ".processes")), **knobs}


def _complete(url: str, model: str) -> list[int]:
    body = {"model": model, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    answer = httpx.post(f"{url}/v1/completions", json={**body, "return_token_ids": True}, timeout=60)
    assert answer.status_code == 200, answer.text
    ids: list[int] = answer.json()["choices"][0]["token_ids"]
    return ids


def _records(host: Path) -> list[dict[str, Any]]:
    directory = host.with_name(host.name + ".processes")
    return [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]


def _server_pid(daemon: RunningDaemon, name: str) -> int:
    pid: int = json.loads((daemon.state_dir / "processes" / f"{name}.json").read_text())["pid"]
    return pid


def _pair(host: Path, b_knobs: dict[str, str] | None = None) -> dict[str, Any]:
    """a and b at sleep_level = "suspend" on one GPU, their NVML records beside the host; `b_knobs` for b."""
    member = {**MEMBER, "sleep_level": "suspend"}
    return {
        "a": process_deployment(free_port(), served_model_name="ma", env=_nvml_env(host), **member),
        "b": process_deployment(free_port(), served_model_name="mb", env=_nvml_env(host, **(b_knobs or {})), **member),
    }


@contextmanager
def _pair_daemon(
    tmp_path: Path, b_knobs: dict[str, str] | None = None, **more: Any
) -> Iterator[tuple[RunningDaemon, str, Path]]:
    """A daemon running the pair behind a gateway: (daemon, the gateway's URL, the recorded host)."""
    gateway = free_port()
    host = write_host(tmp_path / "host.json")
    settings = {"gateway": {"listen": f"127.0.0.1:{gateway}"}, **more}
    with running_daemon(tmp_path, _pair(host, b_knobs), hardware=host, extra_globals=settings) as daemon:
        yield daemon, f"http://127.0.0.1:{gateway}", host


def test_a_pair_takes_turns_suspended_the_sleeper_holding_0_bytes_and_each_wake_answering_the_same_ids(
    tmp_path: Path,
) -> None:
    scrape = free_port()
    with _pair_daemon(tmp_path, metrics_listen=f"127.0.0.1:{scrape}") as (daemon, url, host):
        daemon.wait_for("a", lambda d: d["state"] == "ready", timeout=60)
        b = daemon.wait_for("b", lambda d: d["state"] == "asleep", timeout=60)
        assert b["swap"]["level"] == "suspend" and b["swap"]["suspend_failure"] is None
        assert b["gpu_memory_held_bytes"] == 0, "the sleeper's engine core holds nothing on the GPU"
        states = {r["pid"]: str(r.get("gpu_state")) for r in _records(host)}
        assert sorted(states.values()) == ["checkpointed", "running"]
        first_a = _complete(url, "ma")

        first_b = _complete(url, "mb")  # a suspended, b restored, unlocked and woken (its canary checked)
        a = daemon.wait_for("a", lambda d: d["state"] == "asleep", timeout=60)
        assert a["swap"]["level"] == "suspend" and a["gpu_memory_held_bytes"] == 0
        assert _complete(url, "ma") == first_a  # and back: the same greedy ids
        assert _complete(url, "mb") == first_b
        daemon.wait_for("a", lambda d: d["state"] == "asleep", timeout=60)

        assert [e["deployment"] for e in daemon.events_named("wake_verified")] == ["b", "a", "b"]
        assert {e["deployment"] for e in daemon.events_named("gpu_suspended")} == {"a", "b"}
        assert daemon.events_named("gpu_resumed")
        swaps = (daemon.status() or {})["swaps"]  # the console's Swap page
        sleeps = [s for s in swaps if s["kind"] == "sleep"]
        assert sleeps and all(s["ok"] and s["level"] == "suspend" for s in sleeps)
        assert all(
            s["checks"][0]["held_bytes"] == 0 and "0 bytes held suspended" in s["checks"][0]["detail"] for s in sleeps
        )
        assert all(s["ok"] and s["level"] == "suspend" for s in swaps if s["kind"] == "wake")
        metrics = httpx.get(f"http://127.0.0.1:{scrape}/metrics", timeout=10).text
        assert 'dankserve_sleep_state{deployment="a",swap_group="g"} 4.0' in metrics
        shown = daemon.cli("status", "a").stdout
        assert "suspended" in shown, shown


def test_a_failing_gpu_checkpoint_leaves_the_member_at_plain_level_1_unlocked_with_the_reason(tmp_path: Path) -> None:
    with _pair_daemon(tmp_path, {"FAKE_VLLM_GPU_CHECKPOINT_FAIL": "1"}) as (daemon, url, host):
        daemon.wait_for("a", lambda d: d["state"] == "ready", timeout=60)
        b = daemon.wait_for("b", lambda d: d["state"] == "asleep", timeout=60)
        assert b["swap"]["level"] == "1", "undone: asleep at plain level 1"
        assert "CUDA_ERROR_NOT_SUPPORTED" in b["swap"]["suspend_failure"]
        assert "its suspend failed" in b["why"]
        assert [u["level"] for u in b["swap"]["unsafe_levels"]] == ["suspend"], "it would fail the same way again"
        assert all(r.get("gpu_state") == "running" for r in _records(host)), "nothing left locked"
        assert b["gpu_memory_held_bytes"] > 0
        (failed,) = daemon.events_named("suspend_failed")
        assert failed["lasting"] is True
        (entry,) = [s for s in (daemon.status() or {})["swaps"] if s["deployment"] == "b"]
        assert entry["level"] == "1" and not entry["ok"] and "plain level 1" in entry["failure"]
        assert entry["seconds"] is not None
        assert entry["checks"][0]["verdict"] == "passed", "checked as the level-1 sleep it is"

        _complete(url, "mb")  # b wakes from level 1; a suspends
        daemon.wait_for("a", lambda d: d["state"] == "asleep" and d["swap"]["level"] == "suspend", timeout=60)
        _complete(url, "ma")  # b's next sleep takes level 1 at once (suspend marked unsafe for it)
        b = daemon.wait_for("b", lambda d: d["state"] == "asleep", timeout=60)
        assert b["swap"]["level"] == "1" and b["swap"]["suspend_failure"] is None
        assert len(daemon.events_named("suspend_failed")) == 1
        (chose,) = [e for e in daemon.events_named("swap_sleep") if e["deployment"] == "b"][-1:]
        assert "unsafe" in chose["why"]


def test_a_suspended_member_killed_with_9_is_booted_again_normally(tmp_path: Path) -> None:
    with _pair_daemon(tmp_path) as (daemon, url, _):
        daemon.wait_for("a", lambda d: d["state"] == "ready", timeout=60)
        b = daemon.wait_for("b", lambda d: d["state"] == "asleep" and d["swap"]["level"] == "suspend", timeout=60)
        os.killpg(_server_pid(daemon, "b"), signal.SIGKILL)
        daemon.wait_for("b", lambda d: d["state"] == "asleep" and d["swap"]["level"] == "stop", timeout=60)
        assert _complete(url, "mb")  # its request boots it (a suspended to make room)
        after = daemon.wait_for("b", lambda d: d["state"] == "ready", timeout=60)
        assert after["boots"] == b["boots"] + 1
        daemon.wait_for("a", lambda d: d["state"] == "asleep" and d["swap"]["level"] == "suspend", timeout=60)


def test_auto_suspends_a_sleeper_when_the_woken_member_would_not_fit_beside_its_leftovers(tmp_path: Path) -> None:
    """An 8 GiB GPU: the woken member's 0.9 beside a sleeper's CUDA context (1 GiB) does not fit, so `auto` takes
    suspend for a sleep that makes room; the start-up sleep (room for no one) stays at level 1."""
    gateway = free_port()
    url = f"http://127.0.0.1:{gateway}"
    host = write_host(tmp_path / "host.json")
    data = json.loads(host.read_text())
    for gpu in data["gpus"]:
        gpu["memory_total_bytes"], gpu["memory_free_bytes"] = 8 << 30, (8 << 30) - (32 << 20)
    host.write_text(json.dumps(data))
    settings = {"gateway": {"listen": f"127.0.0.1:{gateway}"}}
    env = {"FAKE_VLLM_GPU_MEMORY_BYTES": str(8 << 30)}
    deployments = {
        name: process_deployment(free_port(), served_model_name=f"m{name}", env=_nvml_env(host, **env), **MEMBER)
        for name in ("a", "b")
    }
    with running_daemon(tmp_path, deployments, hardware=host, extra_globals=settings) as daemon:
        daemon.wait_for("a", lambda d: d["state"] == "ready", timeout=60)
        b = daemon.wait_for("b", lambda d: d["state"] == "asleep", timeout=60)
        assert b["swap"]["level"] == "1"
        _complete(url, "mb")
        a = daemon.wait_for("a", lambda d: d["state"] == "asleep", timeout=60)
        assert a["swap"]["level"] == "suspend" and a["gpu_memory_held_bytes"] == 0
        (chose,) = [e for e in daemon.events_named("swap_sleep") if e["deployment"] == "a"]
        assert chose["why"].startswith("memory is tight: on GPU") and chose["sleep_level"] == "suspend"


def test_a_daemon_killed_with_9_leaves_a_suspended_member_that_the_next_daemon_adopts_and_wakes(
    tmp_path: Path,
) -> None:
    """The state file keeps the level: the next daemon adopts b asleep at suspend (its server untouched, 0 bytes
    held), and its wake restores and unlocks what the driver says is checkpointed, then wakes it: the same ids."""
    with _pair_daemon(tmp_path) as (daemon, url, _):
        daemon.wait_for("a", lambda d: d["state"] == "ready", timeout=60)
        b = daemon.wait_for("b", lambda d: d["state"] == "asleep" and d["swap"]["level"] == "suspend", timeout=60)
        first_a = _complete(url, "ma")
        server = _server_pid(daemon, "b")
        daemon.kill()
        daemon.start()
        adopted = daemon.wait_for("b", lambda d: d["state"] == "asleep", timeout=60)
        assert adopted["swap"]["level"] == "suspend" and adopted["gpu_memory_held_bytes"] == 0
        assert _server_pid(daemon, "b") == server and adopted["boots"] == b["boots"]
        daemon.wait_for("a", lambda d: d["state"] == "ready", timeout=60)
        assert [e["deployment"] for e in daemon.events_named("adopting_asleep")] == ["b"]
        _complete(url, "mb")
        daemon.wait_for("a", lambda d: d["state"] == "asleep" and d["swap"]["level"] == "suspend", timeout=60)
        assert "b" in [e["deployment"] for e in daemon.events_named("gpu_resumed")]
        assert _complete(url, "ma") == first_a
