"""End-to-end tests of launcher boots: a real `dankserve run` with the stand-in under the launcher (process runtime).

tests/supervisor/test_daemon_podman.py has the container path on the real Podman service.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from dankserve.runtime.launcher_client import LauncherClient, LauncherStatus
from dankserve.testing.config_file import write_config
from tests.harness.daemon import RunningDaemon, free_port, launcher_deployment, running_daemon
from tests.harness.wait import stays_true

pytestmark = pytest.mark.slow


def ready(d: dict[str, Any]) -> bool:
    return bool(d["state"] == "ready")


def failed(d: dict[str, Any]) -> bool:
    return bool(d["state"] == "failed")


def launcher_pid(daemon: RunningDaemon, name: str) -> int:
    pid: int = json.loads((daemon.state_dir / "processes" / f"{name}.json").read_text())["pid"]
    return pid


def launcher(daemon: RunningDaemon, name: str) -> LauncherStatus:
    return LauncherClient(daemon.state_dir / "launchers" / name).status()


def server_pid(daemon: RunningDaemon, name: str) -> int:
    server = launcher(daemon, name).server
    assert server is not None and not server.exited
    return server.pid


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def log_text(daemon: RunningDaemon, name: str) -> str:
    return (daemon.state_dir / "processes" / f"{name}.log").read_text()


def test_a_killed_server_restarts_in_the_same_launcher_forked_warm(tmp_path: Path) -> None:
    """A server killed with -9 while serving fails as before; the same launcher forks the next one, learned bytes."""
    with running_daemon(tmp_path, {"chat": launcher_deployment(free_port())}) as daemon:
        first = daemon.wait_for("chat", ready)
        assert first["boots"] == 1 and first["kv_cache_learned_used"] is False
        keeper = launcher_pid(daemon, "chat")
        status = launcher(daemon, "chat")
        assert status.server is not None and status.server.mode == "fork"
        os.killpg(status.server.pid, signal.SIGKILL)
        second = daemon.wait_for("chat", lambda d: ready(d) and d["boots"] == 2)
        assert second["last_failure"]["class"] == "engine_dead"  # it died while serving, as a plain server
        assert second["kv_cache_learned_used"] is True and second["compile_cache_hit"] is True
        assert launcher_pid(daemon, "chat") == keeper
        assert "'kv_cache_memory_bytes'" in log_text(daemon, "chat").split("server 2 started", 1)[1]
        assert len(daemon.events_named("reusing_launcher")) == 1


def test_down_and_up_keep_the_launcher_and_sigterm_leaves_nothing(tmp_path: Path) -> None:
    """`down` stops the server only; `up` asks the same launcher; SIGTERM stops server and launcher."""
    with running_daemon(tmp_path, {"chat": launcher_deployment(free_port())}) as daemon:
        daemon.wait_for("chat", ready)
        keeper = launcher_pid(daemon, "chat")
        first_server = server_pid(daemon, "chat")
        assert daemon.request({"command": "down", "deployment": "chat"}) == {"ok": True}
        assert not alive(first_server) and alive(keeper)
        assert daemon.request({"command": "up", "deployment": "chat"}) == {"ok": True}
        daemon.wait_for("chat", lambda d: ready(d) and d["boots"] == 2)
        assert launcher_pid(daemon, "chat") == keeper
        second_server = server_pid(daemon, "chat")
        assert daemon.stop() == 0
        assert not alive(second_server) and not alive(keeper)


def test_sigterm_removes_a_launcher_kept_by_down(tmp_path: Path) -> None:
    """A launcher `down` kept idle is stopped by SIGTERM too."""
    with running_daemon(tmp_path, {"chat": launcher_deployment(free_port())}) as daemon:
        daemon.wait_for("chat", ready)
        keeper = launcher_pid(daemon, "chat")
        daemon.request({"command": "down", "deployment": "chat"})
        assert alive(keeper)
        assert daemon.stop() == 0
        assert not alive(keeper)


def test_a_reload_keeps_the_launcher_unless_the_port_changes(tmp_path: Path) -> None:
    """A changed max_num_seqs gets a new server from the same launcher; a changed port a new launcher."""
    port = free_port()
    with running_daemon(tmp_path, {"chat": launcher_deployment(port)}) as daemon:
        daemon.wait_for("chat", ready)
        keeper = launcher_pid(daemon, "chat")
        globals_text = daemon.config.read_text().split("[deployments.", 1)[0]

        def reload(dep: dict[str, Any]) -> None:
            write_config(daemon.config, {}, {"chat": dep})
            daemon.config.write_text(globals_text + daemon.config.read_text())
            daemon.signal(signal.SIGHUP)

        reload(launcher_deployment(port, max_num_seqs=16))
        daemon.wait_for("chat", lambda d: ready(d) and d["boots"] == 2)
        assert launcher_pid(daemon, "chat") == keeper
        reload(launcher_deployment(free_port(), max_num_seqs=16))
        daemon.wait_for("chat", lambda d: ready(d) and d["boots"] == 3)
        assert launcher_pid(daemon, "chat") != keeper and not alive(keeper)


def test_a_daemon_killed_with_9_is_followed_by_adoption_of_launcher_and_server(tmp_path: Path) -> None:
    """After kill -9 of the daemon, the next one adopts the launcher's running server: no new server."""
    with running_daemon(tmp_path, {"chat": launcher_deployment(free_port())}) as daemon:
        daemon.wait_for("chat", ready)
        keeper, server = launcher_pid(daemon, "chat"), server_pid(daemon, "chat")
        daemon.kill()
        assert alive(keeper) and alive(server)
        daemon.start()
        status = daemon.wait_for("chat", ready)
        assert status["boots"] == 1
        assert (launcher_pid(daemon, "chat"), server_pid(daemon, "chat")) == (keeper, server)
        assert len(daemon.events_named("adopting")) == 1


def test_a_dead_launcher_takes_its_server_along_and_is_replaced(tmp_path: Path) -> None:
    """kill -9 of the launcher ends its server too (parent-death signal); the daemon starts a new launcher."""
    with running_daemon(tmp_path, {"chat": launcher_deployment(free_port())}) as daemon:
        daemon.wait_for("chat", ready)
        keeper, server = launcher_pid(daemon, "chat"), server_pid(daemon, "chat")
        os.kill(keeper, signal.SIGKILL)
        status = daemon.wait_for("chat", lambda d: ready(d) and d["boots"] == 2)
        assert status["last_failure"]["class"] in ("crash", "engine_dead")
        assert not alive(server)
        assert launcher_pid(daemon, "chat") != keeper


@pytest.mark.parametrize(
    ("fail", "cause", "globals_"),
    [
        ("oom_load", "oom_load", {}),
        ("hang", "boot_timeout", {"boot_timeout_seconds": 2}),
        ("engine_dead", "engine_dead", {}),
    ],
)
def test_failures_of_launcher_servers_are_classified_as_before(
    tmp_path: Path, fail: str, cause: str, globals_: dict[str, Any]
) -> None:
    """OOM at load, a hung boot and a dead engine are classified as with a plain server, in the same launcher."""
    dep = launcher_deployment(free_port(), env={"FAKE_VLLM_FAIL": fail})
    with running_daemon(tmp_path, {"chat": dep}, extra_globals=globals_) as daemon:
        status = daemon.wait_for("chat", lambda d: d["last_failure"] is not None and d["boots"] >= 2, timeout=60)
        assert status["last_failure"]["class"] == cause
        assert len({e.get("container_id") for e in daemon.events_named("started")}) == 1


def test_a_bad_argument_is_a_configuration_error_under_the_launcher(tmp_path: Path) -> None:
    """A flag vLLM rejects fails the deployment with vLLM's message, not restarted; SIGTERM then removes the
    failed deployment's idle launcher too."""
    dep = launcher_deployment(free_port(), extra_args=["--max-num-seqz", "16"])
    with running_daemon(tmp_path, {"chat": dep}) as daemon:
        status = daemon.wait_for("chat", failed)
        assert status["last_failure"]["class"] == "bad_argument"
        assert "unrecognized arguments" in status["message"]
        stays_true(lambda: len(daemon.events_named("started")) == 1, 0.5, what="one boot (no retry)")
        keeper = launcher_pid(daemon, "chat")
        assert alive(keeper)
        assert daemon.stop() == 0
        assert not alive(keeper)


def test_swap_group_members_under_process_launchers_sleep_or_stop_their_server_only(tmp_path: Path) -> None:
    """Process runtime: a level-1 member sleeps and wakes its forked server; a sleep_level = stop member's
    launcher process outlives its stopped server and forks the next one on wake; SIGTERM leaves neither."""
    member = {"gpus": [0], "gpu_memory_utilization": 0.9, "swap_group": "g"}
    deployments = {
        "a": launcher_deployment(free_port(), served_model_name="ma", sleep_level="1", **member),
        "b": launcher_deployment(free_port(), served_model_name="mb", sleep_level="stop", **member),
    }
    gateway = free_port()
    url = f"http://127.0.0.1:{gateway}/v1/completions"
    with running_daemon(tmp_path, deployments, extra_globals={"gateway": {"listen": f"127.0.0.1:{gateway}"}}) as daemon:
        daemon.wait_for("a", ready)
        daemon.wait_for("b", lambda d: d["state"] == "asleep" and d["swap"]["level"] == "stop")
        keepers = {name: launcher_pid(daemon, name) for name in ("a", "b")}
        stopped = launcher(daemon, "b").server
        assert stopped is not None and stopped.exited and alive(keepers["b"])
        a_server = server_pid(daemon, "a")

        reply = httpx.post(url, json={"model": "mb", "prompt": "hi"}, timeout=60)
        assert reply.status_code == 200, reply.text
        assert daemon.wait_for("a", lambda d: d["state"] == "asleep")["swap"]["level"] == "1"
        assert daemon.wait_for("b", ready)["boots"] == 2 and launcher_pid(daemon, "b") == keepers["b"]
        assert alive(a_server), "level 1 keeps the server"

        reply = httpx.post(url, json={"model": "ma", "prompt": "hi"}, timeout=60)
        assert reply.status_code == 200, reply.text
        daemon.wait_for("b", lambda d: d["state"] == "asleep")
        assert server_pid(daemon, "a") == a_server and launcher_pid(daemon, "b") == keepers["b"]
        assert daemon.stop() == 0
        assert not any(alive(pid) for pid in (*keepers.values(), a_server))
