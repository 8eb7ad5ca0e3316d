"""`dankserve logs [-f] [--json] [--since TIME] [--deployment NAME]`: the daemon's and the servers'
logs together, in time order, a timestamp (to the millisecond) on every line.

The daemon's lines: from journald where it runs (`journalctl -o json` of the entries this daemon
wrote: SYSLOG_IDENTIFIER=dankserve and DANKSERVE_STATE_DIR= its state dir, plus DEPLOYMENT=NAME for
one deployment) and from its log file in the state dir (a daemon started in the background writes
one). The servers' lines: from the runtime (Podman's k8s-file log of each container, or a process's
log file), shown as the workload's name, with the time the runtime stored (conmon's k8s-file, a
process's line-times file) or else vLLM's own prefix (dankserve.logview).

The servers a deployment had before its running one (a restart, a crash, `down` then `up`) are kept
by the runtime when it removes them (the last few, bounded: `runtime.log_archive`); their lines are
merged in, shown as `dankserve-NAME[-1]` (the one before the running one), `[-2]` and so on.
`--previous` shows only the last ended server's lines, as `kubectl logs --previous` does.

With -f it keeps printing as lines arrive, the way `journalctl -f` does, from every source at once:
the journal, daemon.log, and each deployment's server, including every server that replaces the
one running when it began (a restart, `down` then `up`, a swap group's boots).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click

from dankserve.cli.context import cli_context
from dankserve.cli.options import complete_deployment
from dankserve.errors import DankserveError, InvalidInput, NotTheDaemonsUser
from dankserve.exitcodes import ExitCode
from dankserve.logsources import (
    DAEMON_LOG,
    RESCAN_SECONDS,
    DaemonLog,
    Emit,
    ServerLog,
    ended_lines,
    follow_journal,
    journal_available,
    journal_history,
)
from dankserve.logview import Reorder, TimedLine, merged, parse_since
from dankserve.settings import Settings

if TYPE_CHECKING:
    from dankserve.runtime.base import Runtime

HOLD_SECONDS = 2 * RESCAN_SECONDS
"""`-f` holds each line this long, so lines of several sources that arrive within it print in time order
(daemon.log is read every RESCAN_SECONDS: its lines come up to that late)."""


@click.command("logs")
@click.argument("name", required=False, shell_complete=complete_deployment)
@click.option(
    "--deployment",
    "-d",
    "deployment_option",
    shell_complete=complete_deployment,
    help="Only this deployment's lines (like NAME).",
)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines, from every server that starts.")
@click.option("-n", "--lines", type=int, default=200, show_default=True, help="Lines of history to show.")
@click.option(
    "--previous",
    "-p",
    is_flag=True,
    help="Only the lines of the server before the running one (the last that ended: a restart, a crash).",
)
@click.option("--since", help='Only lines from this time on: "2026-12-01 13:00", today, yesterday, "10m", "2h ago".')
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line: time, source, deployment, message.")
def command(  # click passes every option by name
    *,
    name: str | None,
    deployment_option: str | None,
    follow: bool,
    lines: int,
    previous: bool,
    since: str | None,
    as_json: bool,
) -> ExitCode:
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
    if previous and follow:
        raise InvalidInput(
            "--previous with --follow: an ended server writes nothing more", fix="leave out one of the two"
        )
    now = datetime.now().astimezone()
    start = parse_since(since, now) if since is not None else None
    emit = _printer(TimedLine.as_json if as_json else TimedLine.render)
    if previous:
        _closed(settings.state_dir, journal=False)  # the ended servers' lines are all in the state dir
        for line in merged(_previous_servers(settings, deployment, now), start, lines):
            emit(line)
        return ExitCode.OK
    journal = journal_available()
    closed = _closed(settings.state_dir, journal)
    # A daemon under systemd logs to the journal; one started in the background (`dankserve up`
    # without the unit) writes daemon.log in the state dir: both are read where they exist.
    journal_lines = journal_history(settings.state_dir, deployment, start, lines) if journal else []
    daemon_log = DaemonLog(_daemon_log_path(settings), deployment)
    servers = [] if closed else [ServerLog(runtime, name) for name, runtime in _runtimes(settings, deployment)]
    ended = [ended_lines(s.runtime, s.deployment, now) for s in servers]
    histories = [journal_lines, daemon_log.history(), *(s.history(now) for s in servers), *ended]
    for line in merged(histories, start, lines):
        emit(line)
    if not follow:
        return ExitCode.OK
    emit = _in_time_order(emit)
    threads = [threading.Thread(target=daemon_log.follow, args=(emit,), daemon=True)]
    threads += [threading.Thread(target=server.follow, args=(emit,), daemon=True) for server in servers]
    if journal:
        journal_args = (settings.state_dir, deployment, emit)
        threads.append(threading.Thread(target=follow_journal, args=journal_args, daemon=True))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return ExitCode.OK


def _closed(state_dir: Path, journal: bool) -> bool:
    """True when the state dir (daemon.log, the servers' output) is another user's: with no journal to read
    instead, an error, since printing nothing would read as "no logs"; else a note, and the journal alone."""
    if not state_dir.exists() or os.access(state_dir, os.R_OK | os.X_OK):
        return False
    if not journal:
        raise NotTheDaemonsUser(
            f"cannot read the daemon's logs: its state dir {state_dir} is closed to uid {os.geteuid()}"
        )
    click.echo(
        f"note: {state_dir} is closed to uid {os.geteuid()}: the journal's lines only, no daemon.log or server output",
        err=True,
    )
    return True


def _printer(render: Callable[[TimedLine], str]) -> Emit:
    """Print lines from several threads, one whole line at a time, each as soon as it comes."""
    lock = threading.Lock()

    def emit(line: TimedLine) -> None:
        with lock:
            click.echo(render(line))
            sys.stdout.flush()

    return emit


def _in_time_order(emit: Emit) -> Emit:
    """An emit that holds each line HOLD_SECONDS and prints them in time order (logview.Reorder), from a thread
    of its own."""
    lock = threading.Lock()
    reorder = Reorder(HOLD_SECONDS)

    def push(line: TimedLine) -> None:
        with lock:
            reorder.push(line, time.monotonic())

    def flush() -> None:
        while True:
            time.sleep(RESCAN_SECONDS / 5)
            with lock:
                due = reorder.due(time.monotonic())
            for line in due:
                emit(line)

    threading.Thread(target=flush, daemon=True).start()
    return push


def _daemon_log_path(settings: Settings) -> Path:
    return settings.state_dir / DAEMON_LOG


def _previous_servers(settings: Settings, deployment: str | None, now: datetime) -> list[list[TimedLine]]:
    """`--previous`: each named deployment's last ended server; none kept for a named one is an error."""
    found = [ended_lines(runtime, name, now, last=1) for name, runtime in _runtimes(settings, deployment)]
    if deployment is not None and not any(found):
        raise InvalidInput(
            f"deployment {deployment!r} has no ended server whose lines are kept",
            fix=f"none ended since its first boot here (a restart, a crash or `down` keeps one); "
            f"`dankserve logs {deployment}` shows the running one's",
        )
    return found


def _runtimes(settings: Settings, deployment: str | None) -> Iterator[tuple[str, Runtime]]:
    from dankserve.supervisor.assembly import runtime_factory

    runtimes = runtime_factory(settings)
    for name in [deployment] if deployment else sorted(settings.deployments):
        try:
            runtime = runtimes(settings.deployments[name])
        except DankserveError as exc:  # Podman away: the daemon's own lines still say why it stopped
            click.echo(f"warning: {name}: its server's lines are left out: {exc.message}", err=True)
            continue
        yield name, runtime
