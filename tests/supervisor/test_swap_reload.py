"""A reload (SIGHUP) touching swap group members: a real daemon, the stand-in under the launcher (process runtime)."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from dankserve.testing.config_file import write_config
from tests.harness.daemon import RunningDaemon, free_port, launcher_deployment, running_daemon
from tests.harness.wait import wait_until
from tests.supervisor.test_daemon_launcher import alive, launcher, launcher_pid, log_text, ready, server_pid

pytestmark = pytest.mark.slow


def _asleep(d: dict[str, Any]) -> bool:
    return bool(d["state"] == "asleep")


def _reload(daemon: RunningDaemon, deployments: dict[str, dict[str, Any]]) -> None:
    """Rewrite the config with these deployments (same globals; at once: a reload may still be reading it), SIGHUP."""
    globals_text = daemon.config.read_text().split("[deployments.", 1)[0]
    draft = write_config(daemon.config.with_suffix(".draft"), {}, deployments)
    draft.write_text(globals_text + draft.read_text())
    draft.replace(daemon.config)
    daemon.signal(signal.SIGHUP)


def _no_server(daemon: RunningDaemon, name: str) -> bool:
    server = launcher(daemon, name).server
    return server is None or server.exited


def _until(check: Callable[[], bool], timeout: float = 30) -> None:
    wait_until(check, timeout)


def test_a_reload_of_a_sleeping_member_stops_its_server_and_boots_it_only_on_its_next_request(tmp_path: Path) -> None:
    """A reload that leaves a member asleep at level 1 unchanged, or changes only what swapping reads, keeps it
    asleep as it is; a changed max_num_seqs stops its server (the launcher stays), it stays asleep at stop
    and the awake member keeps serving; its next request boots it with the new setting."""
    member = {"gpus": [0], "gpu_memory_utilization": 0.9, "swap_group": "g", "sleep_level": "1"}
    ports = {"a": free_port(), "b": free_port()}
    deployments = {
        name: launcher_deployment(port, served_model_name=f"m{name}", **member) for name, port in ports.items()
    }
    gateway = free_port()
    url = f"http://127.0.0.1:{gateway}/v1/completions"
    with running_daemon(tmp_path, deployments, extra_globals={"gateway": {"listen": f"127.0.0.1:{gateway}"}}) as daemon:
        daemon.wait_for("a", ready)
        daemon.wait_for("b", lambda d: _asleep(d) and d["swap"]["level"] == "1")
        a_server, b_server, b_keeper = server_pid(daemon, "a"), server_pid(daemon, "b"), launcher_pid(daemon, "b")

        # Unchanged, then only what swapping reads (idle sleep, level 2 next time): nothing moves.
        _reload(daemon, deployments)
        swapping = {**deployments, "b": {**deployments["b"], "idle_sleep_seconds": 600, "sleep_level": "2"}}
        _reload(daemon, swapping)
        shown = daemon.wait_for("b", lambda d: d["swap"]["idle_sleep_seconds"] == 600)
        assert _asleep(shown) and shown["swap"]["level"] == "1" and shown["boots"] == 1
        _until(lambda: bool(daemon.events_named("reload_swap_settings")))
        assert daemon.events_named("reload_replan") == [] and daemon.wait_for("a", ready)["boots"] == 1
        assert server_pid(daemon, "b") == b_server and server_pid(daemon, "a") == a_server

        # b's plan changes: its server stops, the launcher stays, b stays asleep (stop), a serves on.
        changed = {**swapping, "b": {**swapping["b"], "max_num_seqs": 7}}
        _reload(daemon, changed)
        stopped = daemon.wait_for("b", lambda d: _asleep(d) and d["swap"]["level"] == "stop", timeout=30)
        assert stopped["boots"] == 1
        _until(lambda: not alive(b_server) and _no_server(daemon, "b"))
        assert launcher_pid(daemon, "b") == b_keeper and alive(b_keeper)
        assert daemon.wait_for("a", ready)["boots"] == 1 and server_pid(daemon, "a") == a_server
        kept = daemon.events_named("reload_kept_asleep")
        assert kept and kept[-1]["deployment"] == "b" and "request" in kept[-1]["reason"]

        # Its next request boots it with the new setting, through the same launcher; a makes room.
        reply = httpx.post(url, json={"model": "mb", "prompt": "hi"}, timeout=60)
        assert reply.status_code == 200, reply.text
        assert daemon.wait_for("b", ready)["boots"] == 2 and launcher_pid(daemon, "b") == b_keeper
        assert daemon.wait_for("a", _asleep)["swap"]["level"] == "1" and alive(a_server)
        assert "'max_num_seqs': 7" in log_text(daemon, "b").split("server 2 started", 1)[1]
        assert daemon.stop() == 0


def test_a_reload_adds_a_member_asleep_removes_one_and_restarts_the_awake_one_with_its_change(tmp_path: Path) -> None:
    """A member added to a running group joins asleep by stop (no boot: the awake one serves on) and boots
    on its first request; a removed member goes with its launcher; a changed awake member restarts."""
    member = {"gpus": [0], "gpu_memory_utilization": 0.9, "swap_group": "g", "sleep_level": "1"}
    deps = {name: launcher_deployment(free_port(), served_model_name=f"m{name}", **member) for name in "abc"}
    gateway = free_port()
    url = f"http://127.0.0.1:{gateway}/v1/completions"
    first = {"a": deps["a"], "b": deps["b"]}
    with running_daemon(tmp_path, first, extra_globals={"gateway": {"listen": f"127.0.0.1:{gateway}"}}) as daemon:
        daemon.wait_for("a", ready)
        daemon.wait_for("b", _asleep)
        a_server, b_keeper = server_pid(daemon, "a"), launcher_pid(daemon, "b")

        _reload(daemon, {"a": deps["a"], "c": deps["c"]})
        joined = daemon.wait_for("c", lambda d: _asleep(d) and d["swap"]["level"] == "stop", timeout=30)
        assert joined["boots"] == 0 and daemon.events_named("joined_asleep")[-1]["deployment"] == "c"
        _until(lambda: daemon.deployment("b") is None and not alive(b_keeper))
        assert daemon.wait_for("a", ready)["boots"] == 1 and server_pid(daemon, "a") == a_server

        reply = httpx.post(url, json={"model": "mc", "prompt": "hi"}, timeout=60)
        assert reply.status_code == 200, reply.text
        assert daemon.wait_for("c", ready)["boots"] == 1
        assert daemon.wait_for("a", _asleep)["swap"]["level"] == "1"

        # c, awake, changes: it restarts (nothing else to make room for: a sleeps already).
        _reload(daemon, {"a": deps["a"], "c": {**deps["c"], "max_num_seqs": 5}})
        assert daemon.wait_for("c", lambda d: ready(d) and d["boots"] == 2, timeout=30)
        assert "'max_num_seqs': 5" in log_text(daemon, "c").split("server 2 started", 1)[1]
        assert _asleep(daemon.wait_for("a", _asleep)) and alive(a_server)
        assert daemon.stop() == 0
