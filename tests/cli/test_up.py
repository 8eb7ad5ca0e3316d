"""`dankserve up` through the real CLI: it starts a real daemon in the background (the stand-in vLLM as a
process, a recorded host) and follows it until every deployment rests."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from dankserve.supervisor.instance import running_daemon as daemon_pid
from tests.harness.daemon import daemon_globals, dankserve_cli, free_port, process_deployment, write_config, write_host
from tests.harness.terminal import run_in_terminal
from tests.harness.wait import wait_until

pytestmark = pytest.mark.slow

SWAP_MEMBER = {"gpus": [0], "gpu_memory_utilization": 0.9, "swap_group": "g", "sleep_level": "1"}


@contextlib.contextmanager
def configured(
    tmp_path: Path, deployments: Mapping[str, Mapping[str, Any]], extra_globals: Mapping[str, Any] | None = None
) -> Iterator[tuple[Path, Path]]:
    """The config and recorded host of a test; whatever daemon `up` started is stopped afterwards."""
    config = write_config(tmp_path / "dankserve.toml", daemon_globals(tmp_path, extra_globals), deployments)
    host = write_host(tmp_path / "host.json")
    try:
        yield config, host
    finally:
        pid = daemon_pid(tmp_path / "state")
        if pid is not None:
            dankserve_cli(config, "down", timeout=60)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _swap_group() -> dict[str, dict[str, Any]]:
    return {name: process_deployment(free_port(), served_model_name=name, **SWAP_MEMBER) for name in ("alpha", "beta")}


def test_up_returns_when_a_swap_member_is_asleep(tmp_path: Path) -> None:
    """A two-member swap group: `up` ends 0 once one serves and the other sleeps, one line per deployment saying
    where it rests; after the daemon is killed with -9, `up` again adopts both and returns as soon."""
    with configured(tmp_path, _swap_group()) as (config, host):
        done = dankserve_cli(config, "up", "--hardware", str(host), "--timeout", "90")
        assert done.returncode == 0, done.stdout + done.stderr
        lines = done.stdout.splitlines()
        assert any(line.startswith("alpha: ready, serving at http://127.0.0.1:") for line in lines), done.stdout
        assert "beta: asleep: swap group g, asleep (level 1): its next request wakes it" in lines
        assert "\x1b[" not in done.stdout, "piped: no colour, no progress line"

        pid = daemon_pid(tmp_path / "state")
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        again = dankserve_cli(config, "up", "--hardware", str(host), "--timeout", "30")
        assert again.returncode == 0, again.stdout + again.stderr
        assert "beta: asleep: swap group g" in again.stdout and "alpha: ready, serving at" in again.stdout


def test_up_says_what_a_boot_waits_for_and_shows_its_progress_on_a_terminal(tmp_path: Path) -> None:
    """The member that boots last waits for the other: its line names the group and whom it waits for, with the
    seconds so far; on a terminal a progress line names the boot's steps (weights %, compile, graphs), in colour."""
    deployments = _swap_group()
    for dep in deployments.values():
        dep["env"] = {**dep["env"], "FAKE_VLLM_TIME_SCALE": "0.15"}
    with configured(tmp_path, deployments) as (config, host):
        argv = [sys.executable, "-m", "dankserve", "--config", str(config), "up", "--hardware", str(host)]
        shown = run_in_terminal([*argv, "--timeout", "120"], env={"DANKSERVE_CONFIG": ""})
        assert shown.returncode == 0, shown.output
        out = shown.output
        assert "alpha: planning: waits: swap group g: first boots come one at a time: beta boots" in out, out
        # issue 39 (low): a phase line printed as its phase begins says when it came, never [0s]
        assert "[0s]" not in out and re.search(r"alpha: \w+.* \(\+\d+s\)", out), out
        assert "\r\x1b[K" in out and "loading weights" in out and "capturing CUDA graphs" in out
        assert "beta: waiting" not in out and "alpha: waiting" in out
        assert "\x1b[32mready\x1b[0m, serving at" in out, "the resting state in colour on a terminal"


def test_up_and_status_name_a_held_port_and_it_starts_once_the_port_is_free(tmp_path: Path) -> None:
    """Another process on the port: `up --timeout` ends 6 naming the port, the holder's pid and command line and
    the fix, as human `status` does; once the holder is gone the deployment starts within a second or so, not
    after a grown backoff."""
    port = free_port()
    holder = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"])
    try:
        _wait_listening(port)
        with configured(tmp_path, {"chat": process_deployment(port)}) as (config, host):
            done = dankserve_cli(config, "up", "--hardware", str(host), "--timeout", "8")
            cause = f"port {port} is in use by pid {holder.pid} ({sys.executable} -m http.server {port}"
            assert done.returncode == 6, done.stdout + done.stderr
            assert (
                cause in done.stdout and "fix: stop that process, or give this deployment another `port`" in done.stdout
            )
            assert "not every deployment rests after --timeout 8s (chat)" in done.stderr
            status = dankserve_cli(config, "status")
            assert status.returncode == 0 and cause in status.stdout and "fix: stop that process" in status.stdout
            holder.terminate()
            holder.wait(10)
            started = dankserve_cli(config, "up", "--timeout", "5")
            assert started.returncode == 0, started.stdout + started.stderr
            assert "chat: ready, serving at" in started.stdout
    finally:
        holder.kill()
        holder.wait(10)


def test_up_prints_the_daemons_own_error_when_it_stops_while_starting_and_logs_shows_it(tmp_path: Path) -> None:
    """metrics_listen already taken: the daemon exits 3; `up` prints the daemon's own message and fix and ends 3,
    and `dankserve logs` shows the daemon's line saying so."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = f"127.0.0.1:{taken.getsockname()[1]}"
        deployments = {"chat": process_deployment(free_port())}
        with configured(tmp_path, deployments, {"metrics_listen": listen}) as (config, host):
            done = dankserve_cli(config, "up", "--hardware", str(host), "--timeout", "60")
            assert done.returncode == 3, done.stdout + done.stderr
            assert (
                f"the daemon stopped while starting with exit code 3: cannot serve metrics on {listen}" in done.stderr
            )
            assert "fix: choose a free address and port in metrics_listen" in done.stderr
            assert "daemon.log" in done.stderr and "Traceback" not in done.stderr
            logs = dankserve_cli(config, "logs")
            assert logs.returncode == 0, logs.stderr
            assert "daemon_failed" in logs.stdout and f"cannot serve metrics on {listen}" in logs.stdout


def _wait_listening(port: int) -> None:

    def listening() -> bool:
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    wait_until(listening, 10, what=f"a listener on {port}")


def test_a_timeout_of_zero_or_less_is_refused_before_a_daemon_starts(tmp_path: Path) -> None:
    """`up --timeout -1` and `restart NAME --timeout 0`: exit 2 naming --timeout, and no daemon started."""
    with configured(tmp_path, {"chat": process_deployment(free_port())}) as (config, host):
        for args in (("up", "--hardware", str(host), "--timeout", "-1"), ("restart", "chat", "--timeout", "0")):
            done = dankserve_cli(config, *args)
            assert done.returncode == 2, done.stdout + done.stderr
            assert "Invalid value for '--timeout'" in done.stderr, done.stderr
            assert "started the dankserve daemon" not in done.stdout + done.stderr
            assert daemon_pid(tmp_path / "state") is None


def test_two_ups_at_once_without_a_daemon_both_follow_the_one_that_won(tmp_path: Path) -> None:
    """Issue 39.13: two `up` started together find no daemon and each starts one; the daemon that loses the lock
    exits 3, and its `up` follows the winner's daemon instead of ending 3: both end 0 with chat serving, one daemon
    runs. The one asking for `up chat` gets chat too."""
    deployments = {"chat": process_deployment(free_port(), gpus=[0]), "code": process_deployment(free_port(), gpus=[1])}
    with configured(tmp_path, deployments) as (config, host):
        base = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "DANKSERVE_CONFIG")}
        argv = [sys.executable, "-m", "dankserve", "--config", str(config), "up", "--hardware", str(host)]
        both = [
            subprocess.Popen(
                [*argv, *extra, "--timeout", "90"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=base
            )
            for extra in ((), ("chat",))
        ]
        outs = [proc.communicate(timeout=120) for proc in both]
        texts = [out.decode() + err.decode() for out, err in outs]
        started = [text for text in texts if "started the dankserve daemon" in text]
        for proc, text in zip(both, texts, strict=True):
            assert proc.returncode == 0, text
            assert "chat: ready, serving at http://127.0.0.1:" in text, text
        # Both found no daemon and started one (the usual outcome: a daemon takes its lock only after its
        # imports); the loser's `up` says whom it follows.
        followed = sum("another `dankserve up` started the daemon first" in text for text in texts)
        assert followed == (1 if len(started) == 2 else 0), texts
        assert daemon_pid(tmp_path / "state") is not None


def test_a_request_that_replaces_a_server_rests_only_on_a_later_boot() -> None:
    """Issue 39.7: `rollback` is answered once the worker was told, while the server it replaces still shows ready
    (boot 3): that is no rest; the rollback's own boot (4) ready is; asleep or failed rest whatever the count."""
    from dankserve.cli.up import rests_after

    ready = {"name": "chat", "state": "ready", "rests": True, "boots": 3}
    assert not rests_after(ready, 3)
    assert rests_after({**ready, "boots": 4}, 3)
    assert not rests_after({**ready, "state": "starting", "rests": False, "boots": 4}, 3)
    assert rests_after({**ready, "state": "failed"}, 3) and rests_after({**ready, "state": "asleep"}, 3)
    assert rests_after(ready, None)  # `up`: nothing replaced


def test_ctrl_c_in_up_says_the_boot_goes_on_and_how_to_follow_or_stop_it(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) while `up chat` follows a long boot: exit 130, saying that the daemon goes on with chat's
    boot and naming `status`, `logs -f` and `down`; the daemon indeed goes on and chat turns ready."""
    slow = process_deployment(free_port(), env={"FAKE_VLLM_BOOT_SECONDS": "6"})
    with configured(tmp_path, {"chat": slow}) as (config, host):
        base = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "DANKSERVE_CONFIG")}
        argv = [sys.executable, "-m", "dankserve", "--config", str(config), "up", "chat", "--hardware", str(host)]
        up = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=base, text=True)
        assert up.stdout is not None
        assert "started the dankserve daemon" in up.stdout.readline()
        assert up.stdout.readline().startswith("chat: ")  # following its phases now
        up.send_signal(signal.SIGINT)
        _, err = up.communicate(timeout=30)
        assert up.returncode == 130, err
        assert "the daemon goes on with chat in the background" in err, err
        assert "`dankserve status chat`" in err and "`dankserve logs -f chat`" in err and "`dankserve down chat`" in err
        done = dankserve_cli(config, "up", "chat", "--timeout", "60")
        assert done.returncode == 0 and "chat: ready, serving at" in done.stdout, done.stdout + done.stderr


def test_up_names_no_pull_for_a_process_and_no_stopped_while_it_starts() -> None:
    """Issue 39 (low): the first phase word of a process deployment is not `pulling` (a process pulls nothing) nor
    `stopped` (what `up` asked for is under way); a container's image step says a pull happens only if missing."""
    from dankserve.cli.up import shown_phase

    base = {"name": "chat", "rests": False, "runtime": "process", "weights_percent": None}
    assert shown_phase({**base, "state": "starting", "phase": "pulling"}) == "preparing"
    assert shown_phase({**base, "state": "stopped", "phase": "stopped"}) == "starting"
    container = {**base, "runtime": "podman", "state": "starting", "phase": "pulling"}
    assert shown_phase(container) == "image (pulled if missing)"
    assert shown_phase({**base, "state": "starting", "phase": "loading", "weights_percent": 40}) == "loading 40%"
    assert shown_phase({**base, "state": "stopped", "phase": "stopped", "rests": True}) == "stopped"
