"""Swaps a client can see and trust (issue 29), through a real daemon (subprocess) and its gateway in front
of the stand-in run by the process runtime: predicted wake seconds from the recorded history (status, the
loading comments, /v1/models, Retry-After), slower_than_predicted, requests for the awake member that
arrive while a swap away from it waits, and the bound on swaps per minute."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.harness.daemon import RunningDaemon, free_port, process_deployment, running_daemon
from tests.harness.wait import wait_until

pytestmark = pytest.mark.slow

MEMBER = {"gpus": [0], "gpu_memory_utilization": 0.9, "swap_group": "g", "sleep_level": "1"}
LIVENESS_LINE = '"POST /v1/completions?dankserve=liveness-probe HTTP/1.1" 200'


def _seed_wake_history(state_dir: Path, name: str, seconds: float) -> None:
    """A state file from an earlier daemon whose record of `name` holds one wake of `seconds`."""
    state_dir.mkdir(mode=0o700)
    path = state_dir / "state.json"
    path.write_text(json.dumps({"schema_version": 1, "deployments": {name: {"timings": {"wake": [seconds]}}}}))
    path.chmod(0o600)


def _post(url: str, model: str, done: dict[str, tuple[int, float]], key: str, max_tokens: int = 2) -> None:
    body = {"model": model, "prompt": "hi", "max_tokens": max_tokens}
    reply = httpx.post(url + "/v1/completions", json=body, timeout=60)
    done[key] = (reply.status_code, time.monotonic())


def _asleep(daemon: RunningDaemon, name: str) -> dict[str, Any]:
    return daemon.wait_for(name, lambda d: d["state"] == "asleep", timeout=60)


def test_predicted_waits_drained_swaps_and_the_swap_bound_through_the_real_daemon(tmp_path: Path) -> None:
    """b wakes in 1.5 s where its history said 0.2: logged and counted as slower than predicted. A request for
    the awake a that arrives while b's wake waits for a's request in flight is served after b's (a drains,
    not kept busy); status and /v1/models show b's predicted wake; a streamed request for b gets
    `: dankserve: waking mb, about N s`; the group's fourth swap within a minute (max_swaps_per_minute = 3)
    is refused at once with a Retry-After past the held wait."""
    gateway, metrics = free_port(), free_port()
    url = f"http://127.0.0.1:{gateway}"
    deployments = {
        "a": process_deployment(free_port(), served_model_name="ma", env={"FAKE_VLLM_TOKEN_SECONDS": "0.1"}, **MEMBER),
        "b": process_deployment(free_port(), served_model_name="mb", env={"FAKE_VLLM_WAKE_SECONDS": "1.5"}, **MEMBER),
    }
    _seed_wake_history(tmp_path / "state", "b", 0.2)
    settings = {
        "gateway": {"listen": f"127.0.0.1:{gateway}", "queue_timeout_seconds": 20, "max_swaps_per_minute": 3},
        "metrics_listen": f"127.0.0.1:{metrics}",
    }
    with running_daemon(tmp_path, deployments, extra_globals=settings) as daemon:
        daemon.wait_for("a", lambda d: d["state"] == "ready", timeout=60)
        _asleep(daemon, "b")

        # Swaps 1 and 2: a busy when b's request comes; a's next request waits for its next turn.
        done: dict[str, tuple[int, float]] = {}
        long_a = threading.Thread(target=_post, args=(url, "ma", done, "long a", 20))
        long_a.start()
        wait_until(lambda: "long a" in done, 30, what="a's first request answered")
        for_b = threading.Thread(target=_post, args=(url, "mb", done, "b"))
        for_b.start()
        _asleep(daemon, "a")  # a made room: b's wake is under way (it takes 1.5 s)

        late_a = threading.Thread(target=_post, args=(url, "ma", done, "late a"))
        late_a.start()
        for thread in (long_a, for_b, late_a):
            thread.join(60)
        assert {key: status for key, (status, _) in done.items()} == {"long a": 200, "b": 200, "late a": 200}
        assert done["long a"][1] < done["b"][1] < done["late a"][1], "a served what came first, then drained"
        slower = daemon.events_named("slower_than_predicted")
        assert [(e["deployment"], e["kind"], e["predicted_seconds"]) for e in slower] == [("b", "wake", 0.2)]
        scraped = httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=5).text
        assert 'dankserve_slower_than_predicted_total{deployment="b",kind="wake"} 1.0' in scraped

        # b asleep again with two wakes recorded (0.2 s seeded, ~1.5 s now): its prediction is their median.
        shown = _asleep(daemon, "b")
        predicted = shown["predicted"]["wake_seconds"]
        assert predicted is not None and 0.8 < predicted < 1.0
        listed = {m["id"]: m for m in httpx.get(url + "/v1/models", timeout=5).json()["data"]}
        assert listed["mb"]["state"] == "asleep" and listed["mb"]["ready_seconds"] == pytest.approx(predicted)
        assert (listed["ma"]["state"], listed["ma"]["ready_seconds"]) == ("ready", 0.0)
        text = daemon.cli("status", "b")
        assert text.returncode == 0 and re.search(rf"predicted: cold [\d.]+ s, wake {predicted:.2f} s", text.stdout)

        # Swap 3, streamed: the loading comment says what it waits for and how long it should take.
        body = {"model": "mb", "prompt": "hi", "max_tokens": 2, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as reply:
            lines = [line for line in reply.iter_lines() if line]
        assert re.fullmatch(r": dankserve: waking mb, about \d+\.\d s", lines[0]), lines
        assert lines[-1] == "data: [DONE]"

        # Swap 4 within the minute: held by the bound past queue_timeout_seconds, refused at once.
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as refused:
            client.completions.create(model="ma", prompt="hi", max_tokens=2)
        assert time.monotonic() - started < 5
        assert refused.value.status_code == 503 and "max_swaps_per_minute" in refused.value.message
        assert 20 < int(refused.value.response.headers["Retry-After"]) <= 62
        shown_b = daemon.deployment("b")
        assert shown_b is not None and shown_b["state"] == "ready", "b stays awake, serving"
        assert client.completions.create(model="mb", prompt="hi", max_tokens=2).choices


def test_a_member_asleep_by_stop_is_predicted_from_its_boots_in_the_loading_comment(tmp_path: Path) -> None:
    """Issue 39.6: b sleeps by `stop` (it wakes by booting, ~4 s) and its history holds a sleep-mode wake of 0.2 s:
    the streamed request's loading comments predict b's wake from its boots, not from that 0.2 s, and never show
    a count at or below zero."""
    gateway = free_port()
    url = f"http://127.0.0.1:{gateway}"
    stop_member = {**MEMBER, "sleep_level": "stop"}
    deployments = {
        "a": process_deployment(free_port(), served_model_name="ma", **stop_member),
        "b": process_deployment(
            free_port(), served_model_name="mb", env={"FAKE_VLLM_BOOT_SECONDS": "4"}, **stop_member
        ),
    }
    _seed_wake_history(tmp_path / "state", "b", 0.2)
    settings = {"gateway": {"listen": f"127.0.0.1:{gateway}", "queue_timeout_seconds": 60}}
    with running_daemon(tmp_path, deployments, extra_globals=settings) as daemon:
        daemon.wait_for("a", lambda d: d["state"] == "ready", timeout=60)
        shown = _asleep(daemon, "b")
        boot = shown["predicted"]["cold_seconds"] or shown["predicted"]["warm_seconds"]
        assert boot is not None and boot >= 3.5, shown["predicted"]
        body = {"model": "mb", "prompt": "hi", "max_tokens": 2, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=90) as reply:
            lines = [line for line in reply.iter_lines() if line]
        comments = [line for line in lines if line.startswith(": dankserve: ")]
        assert comments and lines[-1] == "data: [DONE]", lines
        first = re.fullmatch(r": dankserve: waking mb, about (\d+\.\d) s", comments[0])
        assert first is not None and float(first.group(1)) >= 3.0, comments  # its boot, not the 0.2 s wake
        for comment in comments:
            counted = re.search(r"about (-?\d+\.\d) s", comment)
            assert counted is None or float(counted.group(1)) > 0.0, comments


def test_access_logs_of_a_swap_group_hold_traffic_not_dankserves_polls(tmp_path: Path) -> None:
    """A swap (a sleeps, b wakes, then back) polls /is_sleeping at each sleep and wake: none of those polls is
    in `dankserve logs` (as /health is not), the clients' requests are; the liveness probe's completion is
    marked as dankserve's own (`?dankserve=liveness-probe`), not a client's (issue 39 item 12)."""
    gateway = free_port()
    url = f"http://127.0.0.1:{gateway}"
    deployments = {
        "a": process_deployment(free_port(), served_model_name="ma", **MEMBER),
        "b": process_deployment(free_port(), served_model_name="mb", **MEMBER),
    }
    settings = {"gateway": {"listen": f"127.0.0.1:{gateway}"}, "liveness_interval_seconds": 0.5}
    with running_daemon(tmp_path, deployments, extra_globals=settings) as daemon:
        daemon.wait_for("a", lambda d: d["state"] == "ready", timeout=60)
        _asleep(daemon, "b")
        for model in ("mb", "ma"):
            done: dict[str, tuple[int, float]] = {}
            _post(url, model, done, model)
            assert done[model][0] == 200
        # idle and ready: the liveness probe's completions reach a's log
        wait_until(lambda: LIVENESS_LINE in daemon.cli("logs", "a").stdout, 30, 0.5, what="a liveness probe in a's log")
        logs = {name: daemon.cli("logs", name) for name in ("a", "b")}
    for name, shown in logs.items():
        assert shown.returncode == 0, shown.stderr
        access = [line for line in shown.stdout.splitlines() if '" 200' in line and "HTTP/1.1" in line]
        assert not [line for line in access if "/is_sleeping" in line], name
        assert [line for line in access if '"POST /v1/completions HTTP/1.1" 200' in line], name
    assert LIVENESS_LINE in logs["a"].stdout
