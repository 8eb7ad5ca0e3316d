"""`dankserve logs [-f] [DEPLOYMENT]`: the daemon's and the servers' logs together.

The daemon's lines: from journald where it runs (`journalctl SYSLOG_IDENTIFIER=dankserve`, or
`DEPLOYMENT=NAME` for one deployment), else from its log file in the state dir. The servers'
lines: from the runtime (Podman's k8s-file log of each container, or a process's log file),
prefixed with the workload's name. With -f both keep coming, interleaved as they arrive.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from pathlib import Path

import click

from dankserve.cli.context import cli_context
from dankserve.errors import InvalidInput
from dankserve.exitcodes import ExitCode
from dankserve.settings import Settings

JOURNAL_SOCKET = Path("/run/systemd/journal/socket")


def journal_matches(one: str | None) -> list[str]:
    """journalctl matches for the daemon's entries (all, or one deployment's)."""
    return [f"DEPLOYMENT={one}"] if one else ["SYSLOG_IDENTIFIER=dankserve"]


@click.command("logs")
@click.argument("deployment", required=False)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines.")
@click.option("-n", "--lines", type=int, default=200, show_default=True, help="Lines of history to show.")
def command(deployment: str | None, follow: bool, lines: int) -> ExitCode:
    """Show the daemon's lines (journald where it runs) and each server's own output."""
    settings = cli_context().load_settings()
    if deployment is not None and deployment not in settings.deployments:
        known = ", ".join(sorted(settings.deployments)) or "none"
        raise InvalidInput(f"unknown deployment {deployment!r}", fix=f"configured deployments: {known}")
    journal = _daemon_lines_from_journal(deployment, follow, lines)
    if journal is None:
        _daemon_lines_from_file(settings, deployment, lines)
    followers = _server_lines(settings, deployment, follow, lines)
    for thread in followers:
        thread.join()
    if journal is not None:
        journal.wait()
    return ExitCode.OK


def _daemon_lines_from_journal(deployment: str | None, follow: bool, lines: int) -> subprocess.Popen[bytes] | None:
    journalctl = shutil.which("journalctl")
    if journalctl is None or not JOURNAL_SOCKET.exists():
        return None
    argv = [journalctl, "--no-pager", "-o", "short-iso", "-n", str(lines), *journal_matches(deployment)]
    if follow:
        argv.append("-f")
    sys.stdout.flush()
    proc = subprocess.Popen(argv)
    if not follow:
        proc.wait()
    return proc


def _daemon_lines_from_file(settings: Settings, deployment: str | None, lines: int) -> None:
    from dankserve.servicectl import DAEMON_LOG

    try:
        text = (settings.state_dir / DAEMON_LOG).read_text(errors="replace").splitlines()
    except OSError:
        text = []
    for line in text[-lines:]:
        if deployment is None or deployment in line:
            click.echo(line)


def _server_lines(settings: Settings, deployment: str | None, follow: bool, lines: int) -> list[threading.Thread]:
    """Print each workload's recent lines; with follow, threads that keep printing them."""
    from dankserve.supervisor.assembly import runtime_factory

    runtimes = runtime_factory(settings)
    followers = []
    for name in [deployment] if deployment else sorted(settings.deployments):
        runtime = runtimes(settings.deployments[name])
        workload = runtime.find(name)
        if workload is None:
            continue
        history = list(runtime.logs(workload.id, follow=False))
        for line in history[-lines:]:
            click.echo(f"{workload.name}: {line}")
        if follow:

            def keep(
                runtime: object = runtime,
                workload_id: str = workload.id,
                label: str = workload.name,
                shown: int = len(history),
            ) -> None:
                stream = runtime.logs(workload_id, follow=True)  # type: ignore[attr-defined]
                for seen, line in enumerate(stream, start=1):
                    if seen > shown:  # the follow stream starts from the beginning
                        click.echo(f"{label}: {line}")

            thread = threading.Thread(target=keep, daemon=True)
            thread.start()
            followers.append(thread)
    return followers
