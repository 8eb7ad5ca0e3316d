"""Verified sleeps and wakes (issue 29) through a real daemon (subprocess) running the stand-in as plain
processes: a sleep that keeps its memory (FAKE_VLLM_SLEEP_KEEPS_MEMORY, seen through the stand-in's
per-process NVML records) is stopped instead and its level marked unsafe, level 1 then level 2; a wake
that answers other tokens (FAKE_VLLM_WAKE_TOKENS_DIFFER) is never served: stop and boot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness.daemon import RunningDaemon, free_port, process_deployment, running_daemon, write_host

pytestmark = pytest.mark.slow

MEMBER = {"gpus": [0], "gpu_memory_utilization": 0.9, "swap_group": "g"}


def _nvml_env(host: Path, **knobs: str) -> dict[str, str]:
    return {"FAKE_VLLM_NVML_DIR": str(host.with_name(host.name + ".processes")), **knobs}


def _unsafe(daemon: RunningDaemon, name: str) -> list[str]:
    status = daemon.deployment(name)
    assert status is not None
    return sorted(u["level"] for u in status["swap"]["unsafe_levels"])


def _complete(url: str, model: str) -> httpx.Response:
    body = {"model": model, "prompt": "hi", "max_tokens": 2}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60)


def _state_file(daemon: RunningDaemon) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((daemon.state_dir / "state.json").read_text())
    return data


def test_a_sleep_that_keeps_its_memory_is_stopped_and_its_levels_marked_unsafe_one_by_one(tmp_path: Path) -> None:
    """b's sleeps answer but keep the memory: its level-1 sleep at start-up ends stopped (level 1 unsafe);
    woken by a boot, its next sleep tries level 2, which fails too, so it is stopped again and level 2 is
    unsafe; a's sleeps free their memory and pass."""
    gateway = free_port()
    url = f"http://127.0.0.1:{gateway}"
    host = write_host(tmp_path / "host.json")
    deployments = {
        "a": process_deployment(free_port(), served_model_name="ma", env=_nvml_env(host), **MEMBER),
        "b": process_deployment(
            free_port(), served_model_name="mb", env=_nvml_env(host, FAKE_VLLM_SLEEP_KEEPS_MEMORY="1"), **MEMBER
        ),
    }
    settings = {"gateway": {"listen": f"127.0.0.1:{gateway}"}}
    with running_daemon(tmp_path, deployments, hardware=host, extra_globals=settings) as daemon:
        daemon.wait_for("a", lambda d: d["state"] == "ready", timeout=60)
        asleep = daemon.wait_for("b", lambda d: d["state"] == "asleep", timeout=60)
        assert asleep["swap"]["level"] == "stop", "stopped instead of a sleep that kept its memory"
        assert _unsafe(daemon, "b") == ["1"]
        (kept,) = daemon.events_named("sleep_kept_memory")
        assert kept["sleep_level"] == "1" and kept["held_bytes"] > 2 << 30

        assert _complete(url, "mb").status_code == 200  # a sleeps (verified), b boots
        daemon.wait_for("a", lambda d: d["state"] == "asleep", timeout=60)
        assert [e["deployment"] for e in daemon.events_named("sleep_verified")][-1] == "a"
        assert _unsafe(daemon, "a") == []

        assert _complete(url, "ma").status_code == 200  # b sleeps at level 2 now: kept memory again, stopped
        daemon.wait_for("b", lambda d: d["state"] == "asleep" and d["swap"]["level"] == "stop", timeout=60)
        assert _unsafe(daemon, "b") == ["1", "2"]
        assert [e["sleep_level"] for e in daemon.events_named("sleep_kept_memory")] == ["1", "2"]
        assert [u["level"] for u in _state_file(daemon)["deployments"]["b"]["unsafe_sleep"]] == ["1", "2"]
        status = daemon.cli("status", "b")
        assert "unsafe here" in status.stdout
        swaps = (daemon.status() or {})["swaps"]  # the console's Swap page: newest first, checks and failures
        failed = [s for s in swaps if not s["ok"]]
        assert [(s["deployment"], s["kind"], s["level"]) for s in failed] == [("b", "sleep", "2"), ("b", "sleep", "1")]
        assert all(s["checks"][0]["verdict"] == "failed" and "still hold" in s["failure"] for s in failed)
        assert failed[0]["checks"][0]["held_bytes"] > 2 << 30
        passed = next(s for s in swaps if s["deployment"] == "a" and s["kind"] == "sleep")
        assert passed["ok"] and passed["checks"][0]["verdict"] == "passed" and passed["seconds"] is not None
        assert any(s["deployment"] == "b" and s["level"] == "stop" and s["ok"] for s in swaps)  # stopped instead
        assert [s["at"] for s in swaps] == sorted((s["at"] for s in swaps), reverse=True)


def test_a_wake_that_answers_other_tokens_is_restarted_by_stop_and_boot(tmp_path: Path) -> None:
    """a's fingerprint is taken before its first sleep; its wake answers other token ids, so it is stopped and
    booted (one boot more), level 1 marked unsafe, and the request that woke it is still answered."""
    gateway = free_port()
    url = f"http://127.0.0.1:{gateway}"
    deployments = {
        "a": process_deployment(
            free_port(), served_model_name="ma", env={"FAKE_VLLM_WAKE_TOKENS_DIFFER": "1"}, **MEMBER
        ),
        "b": process_deployment(free_port(), served_model_name="mb", **MEMBER),
    }
    settings = {"gateway": {"listen": f"127.0.0.1:{gateway}"}}
    with running_daemon(tmp_path, deployments, extra_globals=settings) as daemon:
        daemon.wait_for("a", lambda d: d["state"] == "ready", timeout=60)
        daemon.wait_for("b", lambda d: d["state"] == "asleep", timeout=60)
        assert _complete(url, "mb").status_code == 200  # a's first sleep records its fingerprint; b wakes, verified
        daemon.wait_for("a", lambda d: d["state"] == "asleep", timeout=60)
        assert [e["deployment"] for e in daemon.events_named("wake_verified")] == ["b"]
        boots = daemon.deployment("a")
        assert boots is not None

        assert _complete(url, "ma").status_code == 200  # a's wake answers other tokens: stop and boot
        daemon.wait_for("a", lambda d: d["state"] == "ready" and d["boots"] == boots["boots"] + 1, timeout=60)
        (wrong,) = daemon.events_named("woke_wrong")
        assert wrong["sleep_level"] == "1" and "other tokens" in wrong["reason"]
        assert _unsafe(daemon, "a") == ["1"]
        canaries = _state_file(daemon)["deployments"]["a"]["canaries"]
        assert len(canaries) == 1 and all(len(ids) == 8 for ids in canaries.values())
