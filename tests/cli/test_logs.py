"""Tests for `dankserve logs` with a real daemon and server (process runtime, no journald)."""

import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from dankserve.systemd.journal import JournalSender, daemon_identity
from tests.harness.daemon import free_port, process_deployment, running_daemon
from tests.harness.journald import journald, read_journal

__all__ = ["journald"]

pytestmark = pytest.mark.slow

STAMPED = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (dankserve|dankserve-chat): ")


def test_logs_show_every_line_with_a_time_and_filter_by_since_and_deployment(tmp_path: Path) -> None:
    """logs prints the daemon's events and the server's output, each line with its time and source; --since and
    --deployment narrow it."""
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
