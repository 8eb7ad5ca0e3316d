"""`dankserve logs [-f] [--since TIME] [--deployment NAME]`: the daemon's and the servers' logs
together, in time order, a timestamp on every line.

The daemon's lines: from journald where it runs (`journalctl -o json SYSLOG_IDENTIFIER=dankserve`,
or `DEPLOYMENT=NAME` for one deployment) and from its log file in the state dir (a daemon started
in the background writes one). The servers'
lines: from the runtime (Podman's k8s-file log of each container, or a process's log file),
shown as the workload's name; their time comes from vLLM's own prefix (dankserve.logview).
With -f new lines keep coming as they arrive, stamped when read.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click

from dankserve.cli.context import cli_context
from dankserve.errors import InvalidInput
from dankserve.exitcodes import ExitCode
from dankserve.logview import TimedLine, daemon_file_line, journal_entry, merged, parse_since, server_lines
from dankserve.settings import Settings

if TYPE_CHECKING:
    from dankserve.runtime.base import Runtime

JOURNAL_SOCKET = Path("/run/systemd/journal/socket")


def journal_matches(one: str | None) -> list[str]:
    """journalctl matches for the daemon's entries (all, or one deployment's)."""
    return [f"DEPLOYMENT={one}"] if one else ["SYSLOG_IDENTIFIER=dankserve"]


@click.command("logs")
@click.argument("name", required=False)
@click.option("--deployment", "-d", "deployment_option", help="Only this deployment's lines (like NAME).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines.")
@click.option("-n", "--lines", type=int, default=200, show_default=True, help="Lines of history to show.")
@click.option("--since", help='Only lines from this time on: "2026-12-01 13:00", today, yesterday, "10m", "2h ago".')
def command(name: str | None, deployment_option: str | None, follow: bool, lines: int, since: str | None) -> ExitCode:
    """Show the daemon's lines and each server's own output, oldest first, each with its time."""
    settings = cli_context().daemon_settings().settings  # the running daemon's when the file is refused
    if name and deployment_option and name != deployment_option:
        raise InvalidInput(
            f"two deployments named: {name!r} and --deployment {deployment_option!r}", fix="name one deployment"
        )
    deployment = deployment_option or name
    if deployment is not None and deployment not in settings.deployments:
        known = ", ".join(sorted(settings.deployments)) or "none"
        raise InvalidInput(f"unknown deployment {deployment!r}", fix=f"configured deployments: {known}")
    now = datetime.now().astimezone()
    start = parse_since(since, now) if since is not None else None
    journal = _journal_available()
    # A daemon under systemd logs to the journal; one started in the background (`dankserve up`
    # without the unit) writes daemon.log in the state dir: both are read where they exist.
    journal_lines = _journal_history(deployment, start, lines) if journal else []
    servers, followers = _server_history(settings, deployment, now, follow)
    for line in merged([journal_lines, _file_history(settings, deployment), *servers], start, lines):
        click.echo(line.render())
    if not follow:
        return ExitCode.OK
    threads = [*followers]
    if journal:
        threads.append(_journal_follower(deployment))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return ExitCode.OK


def _journal_available() -> bool:
    return shutil.which("journalctl") is not None and JOURNAL_SOCKET.exists()


def _journalctl(deployment: str | None, *extra: str) -> list[str]:
    return ["journalctl", "--no-pager", "-o", "json", *extra, *journal_matches(deployment)]


def _journal_history(deployment: str | None, start: datetime | None, lines: int) -> list[TimedLine]:
    extra = ["-n", str(lines)]
    if start is not None:
        extra += ["--since", start.strftime("%Y-%m-%d %H:%M:%S")]
    done = subprocess.run(_journalctl(deployment, *extra), capture_output=True, text=True, check=False)
    return [entry for entry in map(journal_entry, done.stdout.splitlines()) if entry is not None]


def _journal_follower(deployment: str | None) -> threading.Thread:
    def follow() -> None:
        argv = _journalctl(deployment, "-f", "-n", "0")
        with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
            assert proc.stdout is not None
            for raw in proc.stdout:
                entry = journal_entry(raw)
                if entry is not None:
                    _print(entry)

    return threading.Thread(target=follow, daemon=True)


def _file_history(settings: Settings, deployment: str | None) -> list[TimedLine]:
    from dankserve.servicectl import DAEMON_LOG

    try:
        text = (settings.state_dir / DAEMON_LOG).read_text(errors="replace").splitlines()
    except OSError:
        return []
    out = []
    for raw in text:
        if deployment is not None and deployment not in raw:
            continue
        entry = daemon_file_line(raw)
        if entry is not None:
            out.append(entry)
    return out


_print_lock = threading.Lock()


def _print(line: TimedLine) -> None:
    with _print_lock:
        click.echo(line.render())
        sys.stdout.flush()


def _server_history(
    settings: Settings, deployment: str | None, now: datetime, follow: bool
) -> tuple[list[list[TimedLine]], list[threading.Thread]]:
    """Each workload's lines so far; with follow, threads that print its new ones."""
    from dankserve.supervisor.assembly import runtime_factory

    runtimes = runtime_factory(settings)
    histories: list[list[TimedLine]] = []
    followers: list[threading.Thread] = []
    for name in [deployment] if deployment else sorted(settings.deployments):
        runtime = runtimes(settings.deployments[name])
        workload = runtime.find(name)
        if workload is None:
            continue
        history = list(runtime.logs(workload.id, follow=False))
        histories.append(server_lines(workload.name, history, now))
        if follow:
            followers.append(_server_follower(runtime, workload.id, workload.name, len(history)))
    return histories, followers


def _server_follower(runtime: Runtime, workload_id: str, label: str, shown: int) -> threading.Thread:
    def keep() -> None:
        for seen, line in enumerate(runtime.logs(workload_id, follow=True), start=1):
            if seen > shown:  # the follow stream starts from the beginning
                _print(TimedLine(datetime.now().astimezone(), label, line))

    return threading.Thread(target=keep, daemon=True)
