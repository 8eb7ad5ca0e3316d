"""Swap groups in a real daemon, on the real Podman service, with the stand-in vLLM's sleep mode."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dankserve.runtime.base import workload_name
from dankserve.supervisor.probes.sleep_mode import available_ram_bytes
from tests.harness.daemon import (
    LAUNCHER_ENV,
    MODEL_FACTS,
    RunningDaemon,
    free_port,
    running_daemon,
    server_socket,
    socket_client,
    write_host,
)
from tests.harness.gpus import StandInGpus
from tests.harness.podman_service import PodmanEnv
from tests.harness.wait import wait_until
from tests.supervisor.test_daemon_launcher import launcher
from tests.supervisor.test_daemon_podman_launcher import container_ids, server_pid

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
        # A restart here is a boot of a new container: no snapshot, no launcher (their own tests:
        # test_daemon_snapshots_podman.py, test_daemon_podman_launcher.py).
        "snapshot": "off",
        "launcher": False,
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
        # No dev-mode routes: /is_sleeping answers 404, so this member sleeps by being stopped.
        c: _member(vllm_image, "mc", env={"FAKE_VLLM_TIME_SCALE": "0.02", "FAKE_VLLM_NO_DEV_MODE": "1"}),
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
        assert json.loads(woken.stdout)["deployments"][0]["state"] == "ready" and _state(daemon, c)["state"] == "asleep"
        slept = _cli(daemon, "sleep", a)
        assert slept.returncode == 0 and f"{a}: asleep" in slept.stdout, slept.stderr
        assert _cli(daemon, "sleep", a).returncode == 0
        events = [e.get("event") for e in daemon.events()]
        assert {"fell_asleep", "woke_up", "swap_sleep", "swap_wake"} <= set(events)


def _launcher_member(image: str, model: str, sleep_level: str) -> dict[str, Any]:
    env = {"FAKE_VLLM_TIME_SCALE": "0.02", **LAUNCHER_ENV}
    # The launcher's own behaviour: with snapshots a restart restores its whole container instead (tested in
    # tests/supervisor/test_daemon_snapshots_podman.py).
    return _member(image, model, launcher=True, sleep_level=sleep_level, env=env, snapshot="off")


@contextlib.contextmanager
def _group_daemon(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, deployments: dict[str, dict[str, Any]]
) -> Iterator[tuple[RunningDaemon, str]]:
    """A daemon running `deployments` with the gateway on; it and the gateway's /v1/completions URL."""
    gateway_port = free_port()
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])
    globals_ = {"podman_url": podman_env.url, "gateway": {"listen": f"127.0.0.1:{gateway_port}"}}
    with running_daemon(tmp_path, deployments, hardware=host, extra_globals=globals_) as daemon:
        yield daemon, f"http://127.0.0.1:{gateway_port}/v1/completions"


def _awake(daemon: RunningDaemon, names: list[str]) -> list[str]:
    return [n for n in names if _state(daemon, n)["state"] != "asleep"]


def _most_holding(events: list[dict[str, Any]]) -> int:
    """The most members holding GPU memory at once: from a server's start or a level-1/2 wake to its fall asleep."""
    holding: set[str] = set()
    most = 0
    for e in events:
        if e.get("event") == "started" or (e.get("event") == "waking" and e.get("sleep_level") in ("1", "2")):
            holding.add(e["deployment"])
        elif e.get("event") == "fell_asleep":
            holding.discard(e["deployment"])
        most = max(most, len(holding))
    return most


def _kill_asleep_server_then_wake(
    daemon: RunningDaemon, podman_env: PodmanEnv, url: str, awake_asleep: tuple[str, str], container: list[str]
) -> None:
    """Kill the asleep member's server: it stays asleep (stop), then boots in the same container on a request."""
    a, b = awake_asleep
    podman_env.podman("exec", workload_name(b), "sh", "-c", f"kill -9 {server_pid(daemon, b)}")
    died = daemon.wait_for(b, lambda d: d["swap"]["level"] == "stop" and d["last_failure"] is not None, timeout=30)
    assert died["state"] == "asleep" and died["last_failure"]["class"] == "engine_dead"
    assert _state(daemon, a)["state"] == "ready" and container_ids(podman_env, b) == container
    reply = httpx.post(url, json={"model": "mb", "prompt": "hi"}, timeout=60)
    assert reply.status_code == 200, reply.text
    assert _state(daemon, b)["boots"] == 2 and container_ids(podman_env, b) == container
    daemon.wait_for(a, lambda d: d["state"] == "asleep", timeout=10)
    assert _most_holding(daemon.events()) == 1


def test_swap_group_members_under_the_launcher_sleep_wake_and_stop_to_its_next_server(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, vllm_image: str, members: list[str]
) -> None:
    """Members with launcher = true: first boots one at a time (the group's first last); a forked server
    sleeps and wakes at levels 1 and 2 through the gateway; sleep_level = stop stops the server only, and
    its wake asks the same container's launcher for the next one; a server killed asleep leaves the awake
    member alone; SIGTERM leaves no container."""
    a, b, c = members
    deployments = {a: _launcher_member(vllm_image, "ma", "2"), b: _launcher_member(vllm_image, "mb", "1")}
    deployments[c] = _launcher_member(vllm_image, "mc", "stop")
    with _group_daemon(tmp_path, podman_env, gpus, deployments) as (daemon, url):
        daemon.wait_for(a, lambda d: d["state"] == "ready", timeout=180)
        assert daemon.wait_for(b, lambda d: d["state"] == "asleep", timeout=30)["swap"]["level"] == "1"
        assert daemon.wait_for(c, lambda d: d["state"] == "asleep", timeout=30)["swap"]["level"] == "stop"
        # One first boot at a time: each member's server starts after the one before it fell asleep.
        order = [(e["deployment"], e["event"]) for e in daemon.events() if e.get("event") in ("started", "fell_asleep")]
        assert [event for _, event in order] == ["started", "fell_asleep"] * 2 + ["started"], order
        assert order[0][0] == order[1][0] and order[2][0] == order[3][0] and order[4][0] == a
        # Every member keeps its container; c's launcher runs without a server (stopped to sleep).
        containers = {n: container_ids(podman_env, n) for n in members}
        assert all(len(ids) == 1 for ids in containers.values()), containers
        stopped = launcher(daemon, c).server
        assert stopped is not None and stopped.exited
        forked_b = launcher(daemon, b).server
        assert forked_b is not None and forked_b.mode == "fork" and not forked_b.exited

        # A request for b: a (awake, least recently used) sleeps at level 2, b's forked server wakes.
        reply = httpx.post(url, json={"model": "mb", "prompt": "hi"}, timeout=60)
        assert reply.status_code == 200, reply.text
        assert daemon.wait_for(a, lambda d: d["state"] == "asleep", timeout=10)["swap"]["level"] == "2"
        assert _state(daemon, b)["swap"]["last_wake_seconds"] is not None and _awake(daemon, members) == [b]
        assert launcher(daemon, b).server == forked_b, "the same server slept and woke"

        # A request for c: b sleeps, c boots its next server in the same container (learned bytes).
        reply = httpx.post(url, json={"model": "mc", "prompt": "hi"}, timeout=120)
        assert reply.status_code == 200, reply.text
        woke_c = _state(daemon, c)
        assert woke_c["boots"] == 2 and woke_c["kv_cache_learned_used"] is True
        assert _state(daemon, b)["state"] == "asleep" and _awake(daemon, members) == [c]
        assert container_ids(podman_env, c) == containers[c]
        second = launcher(daemon, c).server
        assert second is not None and second.id != stopped.id and not second.exited
        assert [e["deployment"] for e in daemon.events_named("reusing_launcher")] == [c]

        # A request for a (level 2: staged wake): c stops to sleep again, its launcher stays.
        reply = httpx.post(url, json={"model": "ma", "prompt": "hi"}, timeout=60)
        assert reply.status_code == 200, reply.text
        daemon.wait_for(c, lambda d: d["state"] == "asleep", timeout=30)
        assert _awake(daemon, members) == [a] and container_ids(podman_env, c) == containers[c]
        # GPU room: never two members holding their 0.9 of the GPU at once, by the log's order.
        assert _most_holding(daemon.events()) == 1

        # b's server dies asleep: a failure, but nobody waits for b, so it stays asleep (by stop) and a
        # keeps the GPU; the next request for b boots it through the same container's launcher.
        _kill_asleep_server_then_wake(daemon, podman_env, url, (a, b), containers[b])

        # SIGTERM with c asleep by stop (a launcher without a server): nothing is left.
        assert daemon.stop() == 0
        assert all(container_ids(podman_env, n) == [] for n in members)


def _container_pid(podman_env: PodmanEnv, name: str) -> int:
    return int(podman_env.podman("inspect", "--format", "{{.State.Pid}}", workload_name(name)).stdout.strip())


def _adopted_as_it_was(
    daemon: RunningDaemon, podman_env: PodmanEnv, url: str, members: list[str], containers: dict[str, list[str]]
) -> None:
    """a ready (and serving through the gateway), b asleep at level 1, c asleep by stop: no boot, same containers."""
    a, b, c = members
    adopted = daemon.wait_for(a, lambda d: d["state"] == "ready", timeout=60)
    reply = httpx.post(url, json={"model": "ma", "prompt": "hi"}, timeout=60)
    assert reply.status_code == 200, reply.text
    asleep_b = daemon.wait_for(b, lambda d: d["state"] == "asleep", timeout=30)
    asleep_c = daemon.wait_for(c, lambda d: d["state"] == "asleep", timeout=30)
    assert asleep_b["swap"]["level"] == "1" and asleep_c["swap"]["level"] == "stop"
    assert (adopted["boots"], asleep_b["boots"], asleep_c["boots"]) == (1, 1, 1)
    assert {n: container_ids(podman_env, n) for n in members} == containers
    stopped = launcher(daemon, c).server
    assert stopped is not None and stopped.exited


def test_a_daemon_killed_with_9_is_followed_by_one_that_adopts_the_swap_group_as_it_was(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, vllm_image: str, members: list[str]
) -> None:
    """kill -9 of the daemon with a (launcher, level 1) awake, b (plain, level 1) asleep and c (launcher, stop)
    asleep without a server: the next daemon adopts a as ready, b as asleep at level 1, c as asleep by stop, with
    no boot and the same containers and servers; requests then swap as before; killed again with c awake, c stays
    awake; SIGTERM leaves nothing."""
    a, b, c = members
    deployments = {a: _launcher_member(vllm_image, "ma", "1"), b: _member(vllm_image, "mb", sleep_level="1")}
    deployments[c] = _launcher_member(vllm_image, "mc", "stop")
    with _group_daemon(tmp_path, podman_env, gpus, deployments) as (daemon, url):
        daemon.wait_for(a, lambda d: d["state"] == "ready", timeout=180)
        daemon.wait_for(b, lambda d: d["state"] == "asleep", timeout=30)
        daemon.wait_for(c, lambda d: d["state"] == "asleep", timeout=30)
        containers = {n: container_ids(podman_env, n) for n in members}
        assert all(len(ids) == 1 for ids in containers.values()), containers
        servers = (server_pid(daemon, a), _container_pid(podman_env, b))
        before = len(daemon.events())

        daemon.kill()
        daemon.start()
        _adopted_as_it_was(daemon, podman_env, url, members, containers)
        assert (server_pid(daemon, a), _container_pid(podman_env, b)) == servers
        after = daemon.events()[before:]
        assert [e["deployment"] for e in after if e.get("event") == "adopting"] == [a]
        assert sorted(e["deployment"] for e in after if e.get("event") == "adopting_asleep") == [b, c]
        assert not [e for e in after if e.get("event") in ("started", "falling_asleep", "waking")], "no boot, no swap"

        # A request for b: a falls asleep, b's adopted server wakes (no boot).
        reply = httpx.post(url, json={"model": "mb", "prompt": "hi"}, timeout=60)
        assert reply.status_code == 200, reply.text
        assert daemon.wait_for(a, lambda d: d["state"] == "asleep", timeout=10)["swap"]["level"] == "1"
        woke_b = _state(daemon, b)
        assert woke_b["state"] == "ready" and woke_b["boots"] == 1 and _container_pid(podman_env, b) == servers[1]

        # A request for c: b sleeps, c boots its next server through the same launcher.
        reply = httpx.post(url, json={"model": "mc", "prompt": "hi"}, timeout=120)
        assert reply.status_code == 200, reply.text
        assert _state(daemon, c)["boots"] == 2 and container_ids(podman_env, c) == containers[c]
        assert _state(daemon, b)["state"] == "asleep" and _awake(daemon, members) == [c]

        # kill -9 again with c (not the group's first, so put to sleep after a first boot) awake: it stays awake.
        serving_c = server_pid(daemon, c)
        daemon.kill()
        daemon.start()
        assert daemon.wait_for(c, lambda d: d["state"] == "ready", timeout=60)["boots"] == 2
        reply = httpx.post(url, json={"model": "mc", "prompt": "hi"}, timeout=60)
        assert reply.status_code == 200, reply.text
        for name in (a, b):
            assert daemon.wait_for(name, lambda d: d["state"] == "asleep", timeout=30)["swap"]["level"] == "1"
        assert _awake(daemon, members) == [c] and server_pid(daemon, c) == serving_c

        # A request for a: c stops to sleep again; a's adopted server (the same pid) wakes.
        reply = httpx.post(url, json={"model": "ma", "prompt": "hi"}, timeout=60)
        assert reply.status_code == 200, reply.text
        daemon.wait_for(c, lambda d: d["state"] == "asleep", timeout=30)
        assert _awake(daemon, members) == [a] and server_pid(daemon, a) == servers[0]
        assert _most_holding(daemon.events()) == 1

        assert daemon.stop() == 0
        assert all(container_ids(podman_env, n) == [] for n in members)


# kill -9 of the daemon in the middle of a sleep or a wake: the stand-in's knobs widen the window.


def _slow_member(image: str, model: str, sleep_level: str, **knobs: str) -> dict[str, Any]:
    return _member(image, model, sleep_level=sleep_level, env={"FAKE_VLLM_TIME_SCALE": "0.02", **knobs})


def _cli_in_background(daemon: RunningDaemon, *args: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "dankserve", "--config", str(daemon.config), *args]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _completion(url: str, model: str) -> str:
    """A completion through the gateway: its text (empty: weights woken without reload_weights)."""
    reply = httpx.post(url, json={"model": model, "prompt": "hi", "max_tokens": 8}, timeout=60)
    assert reply.status_code == 200, reply.text
    text = reply.json()["choices"][0]["text"]
    assert isinstance(text, str)
    return text


def _is_sleeping(tmp_path: Path, member: str) -> bool:
    """The member's server's own answer (its status may say otherwise), on its private socket behind the gateway."""
    with socket_client(server_socket(tmp_path, member), timeout=10) as server:
        return bool(server.get("/is_sleeping").json()["is_sleeping"])


def _kill_and_start(daemon: RunningDaemon, cli: subprocess.Popen[str]) -> int:
    """kill -9 the daemon (the CLI that waited on it fails), start the next one; the log's length before."""
    daemon.kill()
    cli.communicate(timeout=60)
    before = len(daemon.events())
    daemon.start()
    return before


def _adoptions(daemon: RunningDaemon, before: int) -> dict[str, list[str]]:
    """What the next daemon did with each member: its adopting* events."""
    out: dict[str, list[str]] = {}
    for e in daemon.events()[before:]:
        if str(e.get("event", "")).startswith("adopting"):
            out.setdefault(e["deployment"], []).append(e["event"])
    return out


def test_a_daemon_killed_while_a_member_falls_asleep_is_followed_by_one_that_finishes_the_sleep(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, vllm_image: str, members: list[str]
) -> None:
    """kill -9 once a's /sleep is sent (its server takes 12 s to fall asleep: the next daemon, started under load,
    has adopted by then; 6 s was once too few on 10 workers): the next daemon never adopts a as
    ready (its engine would answer 503, /health staying 200), it sends the sleep again and a is asleep at level
    1; a request wakes it. b, adopted asleep at level 2, then wakes by the staged wake: correct completions."""
    a, b = members[:2]
    deployments = {
        a: _slow_member(vllm_image, "ma", "1", FAKE_VLLM_SLEEP_SECONDS="12"),
        b: _slow_member(vllm_image, "mb", "2"),
    }
    with _group_daemon(tmp_path, podman_env, gpus, deployments) as (daemon, url):
        daemon.wait_for(a, lambda d: d["state"] == "ready", timeout=180)
        assert daemon.wait_for(b, lambda d: d["state"] == "asleep", timeout=30)["swap"]["level"] == "2"
        cli = _cli_in_background(daemon, "sleep", a)
        daemon.wait_for(a, lambda d: d["state"] == "falling_asleep", timeout=30)
        before = _kill_and_start(daemon, cli)

        asleep = daemon.wait_for(a, lambda d: d["state"] == "asleep", timeout=60)
        assert asleep["swap"]["level"] == "1" and asleep["boots"] == 1 and _is_sleeping(tmp_path, a)
        adopted = _adoptions(daemon, before)
        assert adopted == {a: ["adopting_falling_asleep"], b: ["adopting_asleep"]}, adopted
        assert not [e for e in daemon.events()[before:] if e.get("event") == "phase" and e.get("phase") == "ready"]

        assert _completion(url, "ma") != "", "a woke from level 1"
        assert _completion(url, "mb") != "", "b, adopted asleep at level 2, reloaded its weights"
        assert daemon.wait_for(a, lambda d: d["state"] == "asleep", timeout=30)["swap"]["level"] == "1"
        assert _state(daemon, b)["boots"] == 1 and _awake(daemon, [a, b]) == [b]
        assert daemon.stop() == 0


@pytest.mark.parametrize("under_launcher", [False, True], ids=["plain", "launcher"])
def test_a_daemon_killed_while_a_member_stops_to_sleep_is_followed_by_one_that_finishes_the_stop(
    tmp_path: Path,
    podman_env: PodmanEnv,
    gpus: StandInGpus,
    vllm_image: str,
    members: list[str],
    *,
    under_launcher: bool,
) -> None:
    """kill -9 once a (sleep_level = stop) is recorded falling asleep, its server taking 8 s to shut down: the
    next daemon never adopts a as ready, it stops the server again and a is asleep by stop (no server left);
    a's next request boots it, and b (asleep at level 1) stays asleep."""
    a, b = members[:2]
    slow = {"FAKE_VLLM_SHUTDOWN_SECONDS": "8"}
    deployments = {
        a: _slow_member(vllm_image, "ma", "stop", **slow, **(LAUNCHER_ENV if under_launcher else {})),
        b: _slow_member(vllm_image, "mb", "1"),
    }
    if under_launcher:
        deployments[a]["launcher"] = True
    with _group_daemon(tmp_path, podman_env, gpus, deployments) as (daemon, url):
        daemon.wait_for(a, lambda d: d["state"] == "ready", timeout=180)
        daemon.wait_for(b, lambda d: d["state"] == "asleep", timeout=30)
        first = container_ids(podman_env, a)
        cli = _cli_in_background(daemon, "sleep", a)
        daemon.wait_for(a, lambda d: d["state"] == "falling_asleep", timeout=30)
        before = _kill_and_start(daemon, cli)

        asleep = daemon.wait_for(a, lambda d: d["state"] == "asleep", timeout=60)
        assert asleep["swap"]["level"] == "stop" and asleep["boots"] == 1
        adopted = _adoptions(daemon, before)
        assert adopted == {a: ["adopting_falling_asleep"], b: ["adopting_asleep"]}, adopted
        assert not [e for e in daemon.events()[before:] if e.get("event") == "phase" and e.get("phase") == "ready"]
        if under_launcher:  # the launcher stays, without a server
            stopped = launcher(daemon, a).server
            assert container_ids(podman_env, a) == first and stopped is not None and stopped.exited
        else:
            assert container_ids(podman_env, a) == []

        assert _completion(url, "ma") != ""
        assert _state(daemon, a)["boots"] == 2 and _awake(daemon, [a, b]) == [a]
        assert _state(daemon, b)["boots"] == 1 and _is_sleeping(tmp_path, b)
        assert daemon.stop() == 0


def _wait_for_log(podman_env: PodmanEnv, name: str, text: str, timeout: float = 30) -> None:
    def logged() -> bool:
        logs = podman_env.podman("logs", workload_name(name), check=False)
        return text in logs.stdout + logs.stderr

    wait_until(logged, timeout, 0.1, what=f"{name}: {text!r} in its server's log")


def test_a_daemon_killed_while_a_member_wakes_is_followed_by_one_that_wakes_it_again(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, vllm_image: str, members: list[str]
) -> None:
    """kill -9 in a's staged level-2 wake once its weights are woken (reload_weights takes 6 s): the next daemon
    wakes a again, reload included, and a answers correctly; kill -9 in b's level-1 wake (6 s): b is woken again
    and counted awake meanwhile, so the next request for a puts b to sleep: never two servers awake."""
    a, b = members[:2]
    deployments = {
        a: _slow_member(vllm_image, "ma", "2", FAKE_VLLM_RELOAD_SECONDS="6"),
        b: _slow_member(vllm_image, "mb", "1", FAKE_VLLM_WAKE_SECONDS="6"),
    }
    with _group_daemon(tmp_path, podman_env, gpus, deployments) as (daemon, url):
        daemon.wait_for(a, lambda d: d["state"] == "ready", timeout=180)
        daemon.wait_for(b, lambda d: d["state"] == "asleep", timeout=30)
        woken = _cli(daemon, "wake", b)
        assert woken.returncode == 0, woken.stderr
        assert _state(daemon, a)["state"] == "asleep"

        # Level 2: killed between wake_up?tags=weights and the end of reload_weights.
        cli = _cli_in_background(daemon, "wake", a)
        _wait_for_log(podman_env, a, "wake up tags ['weights']")
        before = _kill_and_start(daemon, cli)
        daemon.wait_for(a, lambda d: d["state"] == "ready", timeout=60)
        assert _adoptions(daemon, before) == {a: ["adopting_waking"], b: ["adopting_asleep"]}
        assert _completion(url, "ma") != "", "the weights were reloaded"
        asleep_b = _state(daemon, b)
        assert asleep_b["state"] == "asleep" and asleep_b["swap"]["level"] == "1" and _is_sleeping(tmp_path, b)

        # Level 1: killed in the middle of b's /wake_up.
        cli = _cli_in_background(daemon, "wake", b)
        daemon.wait_for(b, lambda d: d["state"] == "waking", timeout=30)
        before = _kill_and_start(daemon, cli)
        daemon.wait_for(b, lambda d: d["state"] == "ready", timeout=60)
        assert _adoptions(daemon, before) == {b: ["adopting_waking"], a: ["adopting_asleep"]}
        assert _completion(url, "ma") != ""
        slept_b = daemon.wait_for(b, lambda d: d["state"] == "asleep", timeout=30)
        assert _is_sleeping(tmp_path, b), "b's server sleeps as its status says: a and b never both awake"
        assert (_state(daemon, a)["boots"], slept_b["boots"]) == (1, 1)


def test_a_reload_of_a_sleeping_member_removes_its_container_and_boots_it_on_its_next_request(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, vllm_image: str, members: list[str]
) -> None:
    """Containers (no launcher): b, asleep at level 1, gets a new max_num_seqs; its container goes, it stays
    asleep by stop and a keeps serving in its container; a request for b boots it with the new setting."""
    from tests.supervisor.test_swap_reload import _reload

    a, b, _ = members
    deployments = {a: _member(vllm_image, "ma", sleep_level="1"), b: _member(vllm_image, "mb", sleep_level="1")}
    with _group_daemon(tmp_path, podman_env, gpus, deployments) as (daemon, url):
        daemon.wait_for(a, lambda d: d["state"] == "ready", timeout=180)
        daemon.wait_for(b, lambda d: d["state"] == "asleep", timeout=30)
        a_container = container_ids(podman_env, a)
        assert len(container_ids(podman_env, b)) == 1

        _reload(daemon, {**deployments, b: {**deployments[b], "max_num_seqs": 7}})
        stopped = daemon.wait_for(b, lambda d: d["state"] == "asleep" and d["swap"]["level"] == "stop", timeout=60)
        assert stopped["boots"] == 1 and daemon.events_named("reload_kept_asleep")[-1]["deployment"] == b
        daemon.wait_for(b, lambda d: container_ids(podman_env, b) == [], timeout=30)
        assert _state(daemon, a)["state"] == "ready" and container_ids(podman_env, a) == a_container

        reply = httpx.post(url, json={"model": "mb", "prompt": "hi"}, timeout=120)
        assert reply.status_code == 200, reply.text
        assert _state(daemon, b)["boots"] == 2
        assert daemon.wait_for(a, lambda d: d["state"] == "asleep", timeout=10)["swap"]["level"] == "1"
        argv = podman_env.podman("inspect", "--format", "{{json .Config.Cmd}}", workload_name(b)).stdout
        assert "--max-num-seqs" in argv and "7" in json.loads(argv)
        assert _most_holding(daemon.events()) == 1
        assert daemon.stop() == 0
