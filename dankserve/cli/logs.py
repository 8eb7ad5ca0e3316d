"""`dankserve logs [-f] [DEPLOYMENT]`: the daemon's and the containers' logs together.

With journald, `journalctl` with matches for the daemon (SYSLOG_IDENTIFIER=dankserve, which
carries DEPLOYMENT=) and for the containers (CONTAINER_NAME=dankserve-NAME, written by conmon).
Without it, the daemon's log file and the runtime's own logs.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import click

from dankserve.cli.context import cli_context
from dankserve.errors import InvalidInput
from dankserve.exitcodes import ExitCode
from dankserve.runtime.base import workload_name

JOURNAL_SOCKET = Path("/run/systemd/journal/socket")


def journal_matches(deployments: list[str], one: str | None) -> list[str]:
    """journalctl match arguments: the daemon's entries and the containers', OR-ed with '+'."""
    names = [one] if one else deployments
    matches = [f"DEPLOYMENT={one}"] if one else ["SYSLOG_IDENTIFIER=dankserve"]
    for name in names:
        matches += ["+", f"CONTAINER_NAME={workload_name(name)}"]
    return matches


@click.command("logs")
@click.argument("deployment", required=False)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines.")
@click.option("-n", "--lines", type=int, default=200, show_default=True, help="Lines of history to show.")
def command(deployment: str | None, follow: bool, lines: int) -> ExitCode:
    """Show daemon and container logs (through journalctl where journald runs)."""
    settings = cli_context().load_settings()
    if deployment is not None and deployment not in settings.deployments:
        known = ", ".join(sorted(settings.deployments)) or "none"
        raise InvalidInput(f"unknown deployment {deployment!r}", fix=f"configured deployments: {known}")
    journalctl = shutil.which("journalctl")
    if journalctl and JOURNAL_SOCKET.exists():
        argv = [journalctl, "--no-pager", "-o", "short-iso", "-n", str(lines)]
        if follow:
            argv.append("-f")
        argv += journal_matches(sorted(settings.deployments), deployment)
        sys.stdout.flush()
        os.execv(journalctl, argv)
    return _without_journal(settings, deployment, follow, lines)


def _without_journal(settings: object, deployment: str | None, follow: bool, lines: int) -> ExitCode:
    from dankserve.servicectl import DAEMON_LOG
    from dankserve.settings import Settings
    from dankserve.supervisor.assembly import runtime_factory

    assert isinstance(settings, Settings)
    log_path = settings.state_dir / DAEMON_LOG
    try:
        text = log_path.read_text(errors="replace").splitlines()
    except OSError:
        text = []
    for line in text[-lines:]:
        if deployment is None or deployment in line:
            click.echo(line)
    runtimes = runtime_factory(settings)
    names = [deployment] if deployment else sorted(settings.deployments)
    for name in names:
        runtime = runtimes(settings.deployments[name])
        workload = runtime.find(name)
        if workload is None:
            continue
        history = list(runtime.logs(workload.id, follow=False))
        for line in history[-lines:]:
            click.echo(f"{workload.name}: {line}")
        if follow and len(names) == 1:
            for line in runtime.logs(workload.id, follow=True):
                click.echo(f"{workload.name}: {line}")
    return ExitCode.OK
