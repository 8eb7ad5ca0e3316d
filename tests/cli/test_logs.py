"""Tests for `dankserve logs` with a real daemon and server (process runtime, no journald)."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dankserve.systemd.journal import JournalSender, daemon_identity
from tests.harness.daemon import (
    RunningDaemon,
    container_deployment,
    dankserve_cli,
    free_port,
    process_deployment,
    running_daemon,
    write_host,
)
from tests.harness.gpus import StandInGpus
from tests.harness.journald import journald, read_journal
from tests.harness.podman_service import PodmanEnv
from tests.harness.wait import wait_until

__all__ = ["journald"]

pytestmark = pytest.mark.slow

STAMPED = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (dankserve|dankserve-chat): ")


def test_logs_show_every_line_with_a_time_and_filter_by_since_and_deployment(tmp_path: Path) -> None:
    """logs prints the daemon's events and the server's output, each line with its time and source (the server's
    to the millisecond, as its watcher stored them); --since and --deployment narrow it."""
    # A name of this run's own: the journal may hold earlier runs' lines of a "chat" (tests/systemd write there).
    name = f"chat{uuid.uuid4().hex[:8]}"
    stamped = re.compile(STAMPED.pattern.replace("dankserve-chat", f"dankserve-{name}"))
    with running_daemon(tmp_path, {name: process_deployment(free_port())}) as daemon:
        daemon.wait_for(name, lambda d: d["state"] == "ready")
        (daemon.state_dir / "daemon.log").write_text(daemon.log_path.read_text())

        def logs(*args: str) -> list[str]:
            done = subprocess.run(
                [sys.executable, "-m", "dankserve", "--config", str(daemon.config), "logs", *args],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            return done.stdout.splitlines()

        shown = logs("--deployment", name, "-n", "400", "--since", "10m")
        assert shown and all(stamped.match(line) for line in shown), [x for x in shown if not stamped.match(x)]
        assert any(f"dankserve-{name}: " in line and "Application startup complete." in line for line in shown)
        assert any("dankserve: [info] ready " in line for line in shown)
        assert sorted(shown, key=lambda line: line[:23]) == shown
        server = [line for line in shown if f"dankserve-{name}: " in line]
        assert len({line[20:23] for line in server}) > 1, "the server's lines have vLLM's whole seconds only"
        assert logs(name, "--since", "2999-01-01") == []
        assert len(logs("-n", "5")) == 5


def test_unreadable_since_is_an_input_error(tmp_path: Path) -> None:
    """--since that is no time exits 2 naming the value and the accepted forms."""
    config = tmp_path / "dankserve.toml"
    config.write_text(f'state_dir = "{tmp_path}/state"\n')
    config.chmod(0o600)
    done = subprocess.run(
        [sys.executable, "-m", "dankserve", "--config", str(config), "logs", "--since", "last tuesday-ish"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "last tuesday-ish" in done.stderr and "2h ago" in done.stderr


def test_logs_show_the_daemons_lines_when_podman_is_unreachable(tmp_path: Path) -> None:
    """A daemon that stopped while starting, Podman not there: logs prints the daemon's lines, exit 0, and says on
    stderr that the deployment's server lines are left out and why."""
    config = tmp_path / "dankserve.toml"
    config.write_text(
        f'state_dir = "{tmp_path}/state"\npodman_url = "unix://{tmp_path}/absent.sock"\n\n'
        '[deployments.chat]\nmodel = "org/m"\n'
    )
    config.chmod(0o600)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "daemon.log").write_text(
        "2026-12-02 14:11:40.313 [error    ] daemon_failed                  error='no usable NVIDIA GPU' exit_code=3\n"
    )
    done = dankserve_cli(config, "logs", timeout=60)
    assert done.returncode == 0, done.stderr
    assert "daemon_failed" in done.stdout and "no usable NVIDIA GPU" in done.stdout
    assert "warning: chat: its server's lines are left out: " in done.stderr and "Podman" in done.stderr


def test_logs_read_the_daemons_entries_from_journald(tmp_path: Path, journald: str) -> None:
    """Where journald runs, the daemon's entries of one deployment come from the journal, each with its time;
    an entry of another daemon (another state dir) is not shown."""
    name = f"jt{uuid.uuid4().hex[:10]}"
    sender = JournalSender(journald)
    for event in ("phase", "ready"):
        sender.send(
            {
                "MESSAGE": event,
                "PRIORITY": "6",
                "SYSLOG_IDENTIFIER": "dankserve",
                "DEPLOYMENT": name,
                **daemon_identity(tmp_path / "state"),
            }
        )
    sender.send(
        {
            "MESSAGE": "other",
            "PRIORITY": "6",
            "SYSLOG_IDENTIFIER": "dankserve",
            "DEPLOYMENT": name,
            **daemon_identity(tmp_path / "another"),
        }
    )
    sender.close()
    read_journal(f"DEPLOYMENT={name}", expect=3)
    config = tmp_path / "dankserve.toml"
    config.write_text(
        f'state_dir = "{tmp_path}/state"\n[deployments.{name}]\nmodel = "m"\nruntime = "process"\n'
        f'executable = "{sys.executable}"\n'
    )
    config.chmod(0o600)

    def logs(*args: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-m", "dankserve", "--config", str(config), "logs", "--deployment", name, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    shown = logs("--since", "1h ago")
    assert [line.split(": ", 1)[1] for line in shown] == [
        f"[info] phase deployment={name}",
        f"[info] ready deployment={name}",
    ]
    assert all(re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} dankserve: ", line) for line in shown)
    assert logs("--since", "2999-01-01") == []


class Follower:
    """`dankserve logs -f ...` running in its own session, its output collected line by line."""

    def __init__(self, config: Path, *args: str) -> None:
        argv = [sys.executable, "-m", "dankserve", "--config", str(config), "logs", "-f", *args]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, predicate: Callable[[list[str]], bool], timeout: float = 60) -> list[str]:

        def printed() -> bool:
            assert self.proc.poll() is None, f"logs -f exited with {self.proc.returncode}"
            return predicate(list(self.lines))

        wait_until(printed, timeout, 0.1, what=lambda: "logs -f to print what was expected:\n" + "\n".join(self.lines))
        return list(self.lines)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)  # its journalctl child too
        self.proc.wait(10)


def follow_across_down_and_up(
    tmp_path: Path, name: str, deployment: dict[str, Any], **daemon_options: Any
) -> tuple[list[str], list[str]]:
    """`logs -f NAME` started while NAME serves, then `down NAME` and `up NAME` through the CLI: every line
    it printed, and those of the new server (after the old server's first 'Application startup complete.')."""
    with running_daemon(tmp_path, {name: deployment}, log_in_state_dir=True, **daemon_options) as daemon:
        daemon.wait_for(name, lambda d: d["state"] == "ready", timeout=120)
        follower = Follower(daemon.config, name)
        try:
            follower.wait_for(lambda lines: any("Application startup complete." in line for line in lines))
            down = dankserve_cli(daemon.config, "down", name)
            assert down.returncode == 0, down.stderr
            up = dankserve_cli(daemon.config, "up", name, "--timeout", "120")
            assert up.returncode == 0, up.stdout + up.stderr
            follower.wait_for(lambda lines: sum("Application startup complete." in x for x in lines) >= 2)
            follower.wait_for(lambda lines: any(" dankserve: [info] ready " in x for x in lines))
            lines = list(follower.lines)
        finally:
            follower.stop()
    stamped = re.compile(rf"^\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{{3}} (dankserve|dankserve-{name}): ")
    assert all(stamped.match(line) for line in lines), [x for x in lines if not stamped.match(x)]
    # printed in time order across the sources, within a second too (issue 39, low)
    assert sorted(lines, key=lambda line: line[:23]) == lines, lines
    first_boot_end = next(i for i, line in enumerate(lines) if "Application startup complete." in line)
    after = lines[first_boot_end + 1 :]
    daemon_after = [line for line in after if line[24:].startswith("dankserve: ")]
    server_after = [line for line in after if line[24:].startswith(f"dankserve-{name}: ")]
    assert any("[info] phase " in line and "phase=starting" in line for line in daemon_after), daemon_after
    assert any("[info] ready " in line for line in daemon_after), daemon_after
    assert any("Application startup complete." in line for line in server_after), server_after
    return lines, server_after


def test_follow_prints_the_daemons_lines_and_the_next_process_servers_across_down_and_up(tmp_path: Path) -> None:
    """`logs -f` started before `down X; up X` (process runtime, daemon.log) prints the daemon's phases and
    ready and the new server's boot, each stamped to the millisecond."""
    name = f"fw{uuid.uuid4().hex[:8]}"
    lines, _ = follow_across_down_and_up(tmp_path, name, process_deployment(free_port()))
    daemon_lines = [line for line in lines if line[24:].startswith("dankserve: ")]
    assert len({line[20:23] for line in daemon_lines}) > 1, "the daemon's lines lost their milliseconds"


@pytest.mark.podman
def test_follow_prints_the_next_containers_lines_across_down_and_up_with_conmons_times(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, vllm_image: str
) -> None:
    """`logs -f` started before `down X; up X` (Podman) prints the new container's boot too, each line with the
    time conmon stored for it (milliseconds, not vLLM's whole seconds)."""
    name = f"fc{uuid.uuid4().hex[:8]}"
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])
    deployment = container_deployment(vllm_image, free_port(), gpus=[0])
    _, server_after = follow_across_down_and_up(
        tmp_path, name, deployment, hardware=host, extra_globals={"podman_url": podman_env.url}
    )
    assert len({line[20:23] for line in server_after}) > 1, "the servers' lines have whole seconds only"


def test_logs_show_only_this_daemons_journal_entries_when_two_daemons_share_journald(
    tmp_path: Path, journald: str
) -> None:
    """Two daemons (two state dirs, one deployment name) write to one journald; each one's `logs` shows its own
    daemon's entries only."""
    name = f"two{uuid.uuid4().hex[:8]}"
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
    with contextlib.ExitStack() as stack:
        daemons = [
            stack.enter_context(
                running_daemon(tmp_path / side, {name: process_deployment(free_port())}, log_format="journald")
            )
            for side in ("a", "b")
        ]
        for daemon in daemons:
            daemon.wait_for(name, lambda d: d["state"] == "ready")
        read_journal(f"DEPLOYMENT={name}", "MESSAGE=ready", expect=2)
        for daemon in daemons:
            shown = dankserve_cli(daemon.config, "logs", name, "--json", "-n", "1000")
            assert shown.returncode == 0, shown.stderr
            entries = [json.loads(line) for line in shown.stdout.splitlines()]
            daemon_lines = [e for e in entries if e["source"] == "dankserve"]
            readies = [e for e in daemon_lines if e["message"].startswith("[info] ready ")]
            assert len(readies) == 1, daemon_lines
            assert all(e["deployment"] == name for e in daemon_lines)


def logs_after_two_restarts(
    tmp_path: Path, name: str, deployment: dict[str, Any], kill: Callable[[RunningDaemon], None], **options: Any
) -> tuple[list[str], list[str], list[str]]:
    """NAME boots, is restarted through the CLI, then its server dies (`kill`) and the daemon boots it
    again: `logs NAME`, `logs --previous NAME` and `logs --previous NAME` once NAME is down (lines)."""
    with running_daemon(tmp_path, {name: deployment}, log_in_state_dir=True, **options) as daemon:
        daemon.wait_for(name, lambda d: d["state"] == "ready", timeout=120)
        restart = daemon.cli("restart", name)
        assert restart.returncode == 0, restart.stdout + restart.stderr
        daemon.wait_for(name, lambda d: d["state"] == "ready" and d["boots"] >= 2, timeout=120)
        kill(daemon)
        daemon.wait_for(name, lambda d: d["state"] == "ready" and d["boots"] >= 3, timeout=120)
        every = daemon.cli("logs", name, "-n", "5000")
        previous = daemon.cli("logs", "--previous", name)
        assert every.returncode == 0 and previous.returncode == 0, every.stderr + previous.stderr
        down = daemon.cli("down", name)
        assert down.returncode == 0, down.stderr
        after_down = daemon.cli("logs", "-p", name)
        assert after_down.returncode == 0, after_down.stderr
    return every.stdout.splitlines(), previous.stdout.splitlines(), after_down.stdout.splitlines()


def check_every_server_kept(name: str, every: list[str], previous: list[str], after_down: list[str]) -> None:
    started = "Application startup complete."
    # each of the three servers' boot, under its own label, merged in time with the daemon's lines
    for label in (f"dankserve-{name}[-2]", f"dankserve-{name}[-1]", f"dankserve-{name}"):
        assert sum(f" {label}: " in line and started in line for line in every) == 1, (label, every)
    assert sorted(every, key=lambda line: line[:23]) == every
    assert any(" dankserve: [info] ready " in line for line in every)
    # --previous: the one server before the running one, whole: its boot and how it ended
    assert previous and all(f" dankserve-{name}[-1]: " in line for line in previous), previous
    assert sum(started in line for line in previous) == 1, previous
    # once `down` removed the third server, it is the previous one
    assert after_down and all(f" dankserve-{name}[-1]: " in line for line in after_down), after_down
    assert after_down != previous and sum(started in line for line in after_down) == 1, after_down


def test_logs_keep_the_servers_before_a_restart_and_a_crash_process_runtime(tmp_path: Path) -> None:
    """Issue 39.2 (process runtime): after a restart and a crash, `logs NAME` shows all three servers' lines in
    time order, `--previous` the last ended one alone (as kubectl logs --previous)."""
    name = f"pv{uuid.uuid4().hex[:8]}"

    def kill(daemon: RunningDaemon) -> None:
        record = json.loads((daemon.state_dir / "processes" / f"{name}.json").read_text())
        os.killpg(int(record["pid"]), signal.SIGKILL)

    every, previous, after_down = logs_after_two_restarts(tmp_path, name, process_deployment(free_port()), kill)
    check_every_server_kept(name, every, previous, after_down)


@pytest.mark.podman
def test_logs_keep_the_containers_before_a_restart_and_a_crash_podman(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, vllm_image: str
) -> None:
    """Issue 39.2 (Podman): a removed container's lines outlive it: `logs NAME` shows the three containers'
    boots, `--previous` the last removed one's lines alone."""
    name = f"pc{uuid.uuid4().hex[:8]}"
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])

    def kill(daemon: RunningDaemon) -> None:
        podman_env.podman("kill", "-s", "KILL", f"dankserve-{name}")

    every, previous, after_down = logs_after_two_restarts(
        tmp_path,
        name,
        container_deployment(vllm_image, free_port(), gpus=[0]),
        kill,
        hardware=host,
        extra_globals={"podman_url": podman_env.url},
    )
    check_every_server_kept(name, every, previous, after_down)


def test_previous_without_an_ended_server_or_with_follow_is_an_input_error(tmp_path: Path) -> None:
    """`logs --previous NAME` before NAME's server was ever replaced, and `--previous -f`: exit 2, saying why."""
    config = tmp_path / "dankserve.toml"
    config.write_text(
        f'state_dir = "{tmp_path}/state"\n[deployments.chat]\nmodel = "m"\nruntime = "process"\n'
        f'executable = "{sys.executable}"\n'
    )
    config.chmod(0o600)
    done = dankserve_cli(config, "logs", "--previous", "chat")
    assert done.returncode == 2 and "no ended server" in done.stderr, done.stderr
    done = dankserve_cli(config, "logs", "--previous", "-f", "chat")
    assert done.returncode == 2 and "--previous with --follow" in done.stderr, done.stderr
