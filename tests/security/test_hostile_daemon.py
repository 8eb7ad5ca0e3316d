"""Security: a running daemon under hostile input keeps what serves. A bad config on reload
(a nesting bomb, pydantic-settings' own `_options`, a FIFO), the daemon itself out of file
descriptors, a state file from a newer release or one built to crash the reader: none of them
stops or restarts a healthy deployment, and `status` without a daemon changes nothing on disk.

The daemon is a real `dankserve run` with the stand-in as a process-runtime server.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from dankserve.testing.config_file import write_config
from tests.harness.daemon import RunningDaemon, free_port, process_deployment, running_daemon, write_host
from tests.harness.faults import descriptors_exhausted
from tests.harness.wait import hold_for, stays_true, wait_until

pytestmark = pytest.mark.slow


def ready(d: dict[str, Any]) -> bool:
    return bool(d["state"] == "ready")


def server_pid(daemon: RunningDaemon) -> int:
    pid: int = json.loads((daemon.state_dir / "processes" / "chat.json").read_text())["pid"]
    return pid


def bomb(config: Path) -> None:
    config.write_text(config.read_text() + "x = " + "[" * 5000 + "]" * 5000 + "\n")


def pydantic_option(config: Path) -> None:
    config.write_text("_cli_parse_args = true\n" + config.read_text())


def fifo(config: Path) -> None:
    config.unlink()
    os.mkfifo(config, 0o600)


@pytest.mark.parametrize("break_config", [bomb, pydantic_option, fifo], ids=["nesting-bomb", "underscore-key", "fifo"])
def test_a_failing_reload_keeps_the_running_config_and_deployments(tmp_path: Path, break_config: Any) -> None:
    """A reload whose config fails keeps the daemon, its config and its server; status reports the refusal."""
    with running_daemon(tmp_path, {"chat": process_deployment(free_port())}) as daemon:
        daemon.wait_for("chat", ready)
        pid = server_pid(daemon)
        break_config(daemon.config)
        daemon.signal(signal.SIGHUP)
        wait_until(lambda: daemon.events_named("reload_rejected"), 20, 0.1, what=daemon.log_tail)
        # a health check or two later the server is still the one it was, ready
        stays_true(lambda: ready(daemon.deployment("chat") or {}) and server_pid(daemon) == pid, 1.5, 0.3)
        status = daemon.status()
        assert status is not None and status["daemon"]["config"]["refused"] is not None
        chat = daemon.wait_for("chat", ready)
        assert chat["boots"] == 1 and server_pid(daemon) == pid
        assert daemon.stop(timeout=30) == 0  # SIGTERM still works: the main loop never blocked


def test_the_daemon_out_of_descriptors_keeps_a_healthy_server(tmp_path: Path) -> None:
    """EMFILE in the daemon's own health checks is not the server's fault: no kill, no restart, no failure."""
    with running_daemon(
        tmp_path, {"chat": process_deployment(free_port())}, extra_globals={"health_interval_seconds": 0.3}
    ) as daemon:
        daemon.wait_for("chat", ready)
        pid = server_pid(daemon)
        assert daemon.proc is not None
        with descriptors_exhausted(daemon.proc.pid):  # no descriptor left for a new socket
            with contextlib.suppress(AssertionError):  # asserted below, with the log
                wait_until(lambda: "Too many open files" in daemon.log_tail(200), 20, 0.1)
            hold_for(3.0, "the fault held: several more probes or log checks that cannot open anything")
        assert "Too many open files" in daemon.log_tail(200), daemon.log_tail()  # the fault bit
        chat = daemon.wait_for("chat", ready)
        assert chat["boots"] == 1 and chat["restarts"] == 0 and chat["last_failure"] is None
        assert server_pid(daemon) == pid and psutil.pid_exists(pid)
        assert not daemon.events_named("health_failed")


def dankserve(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "DANKSERVE_CONFIG")}
    return subprocess.run(
        [sys.executable, "-m", "dankserve", "--config", str(config), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_a_state_file_from_a_newer_release_is_reported_and_never_moved(tmp_path: Path) -> None:
    """status without a daemon reports a newer release's state and leaves it; the daemon refuses it with exit 3."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    newer = json.dumps({"schema_version": 99, "deployments": {"chat": {"down": True}}})
    (state / "state.json").write_text(newer)
    globals_ = {"state_dir": str(state), "cache_dir": str(tmp_path / "cache"), "vllm_version": "0.33.0"}
    config = write_config(tmp_path / "dankserve.toml", globals_, {"chat": process_deployment(free_port())})
    done = dankserve(config, "status")
    assert done.returncode == 0, done.stderr
    assert "written by a newer dankserve" in done.stderr
    assert (state / "state.json").read_text() == newer and not list(state.glob("state.json.corrupt-*"))
    run = dankserve(config, "run", "--hardware", str(write_host(tmp_path / "host.json")))
    assert run.returncode == 3, run.stdout + run.stderr
    assert "written by a newer dankserve" in run.stderr and "fix:" in run.stderr
    assert "Traceback" not in run.stderr
    assert (state / "state.json").read_text() == newer


@pytest.mark.parametrize(
    "text",
    [
        '{"schema_version": 1, "deployments": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"schema_version": 1, "deployments": {"chat": {"boots": ' + "9" * 5000 + "}}}",
    ],
    ids=["deeply-nested", "5000-digit-int"],
)
def test_a_state_file_built_to_crash_the_reader_is_damage(tmp_path: Path, text: str) -> None:
    """A deeply nested state file or one with a 5,000-digit integer is moved aside and the daemon serves."""
    (tmp_path / "state").mkdir(mode=0o700)
    (tmp_path / "state" / "state.json").write_text(text)
    with running_daemon(tmp_path, {"chat": process_deployment(free_port())}) as daemon:
        daemon.wait_for("chat", ready)
        assert list((tmp_path / "state").glob("state.json.corrupt-*"))


def test_a_restart_without_descriptors_is_retried_not_counted(tmp_path: Path) -> None:
    """A restart that fails for want of the daemon's own descriptors is retried like an outage: no failure
    counted for it, so the deployment never reaches `failed` through it and serves once descriptors are back."""
    deployments = {"chat": process_deployment(free_port())}
    with running_daemon(tmp_path, deployments, extra_globals={"max_failures_in_window": 2}) as daemon:
        daemon.wait_for("chat", ready)
        assert daemon.proc is not None
        with descriptors_exhausted(daemon.proc.pid):
            os.killpg(server_pid(daemon), signal.SIGKILL)  # a real failure, then restarts that cannot start
            wait_until(  # the death noticed, a restart tried without descriptors (backoff from 0.2 s)
                lambda: (
                    daemon.events_named("daemon_resources_exhausted")
                    or "Too many open files" in daemon.log_path.read_text()
                ),
                30,
                0.1,
                what=daemon.log_tail,
            )
        chat = daemon.wait_for("chat", lambda d: ready(d) and d["boots"] >= 2, timeout=60)
        assert chat["restarts"] == 1, chat  # the kill; the starts without descriptors count nothing
        assert daemon.events_named("daemon_resources_exhausted") or "Too many open files" in daemon.log_path.read_text()
        assert not daemon.events_named("deployment_failed")


def test_the_boot_is_on_disk_when_ready_is_reported(tmp_path: Path) -> None:
    """The first status that says ready finds that boot (and its learned KV bytes) saved in state.json."""
    with running_daemon(tmp_path, {"chat": process_deployment(free_port())}) as daemon:
        while True:
            status = daemon.deployment("chat")
            if status is not None and status["state"] == "ready":
                break
            assert daemon.proc is not None and daemon.proc.poll() is None, daemon.log_tail()
        saved = json.loads((daemon.state_dir / "state.json").read_text())["deployments"]["chat"]
        assert saved["last_boot"] is not None and saved["last_boot"]["ready"] is True
        assert saved["learned_kv"], "the learned KV bytes were not saved before ready"
