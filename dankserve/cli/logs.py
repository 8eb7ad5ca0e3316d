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

import contextlib
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click

from dankserve.cli.context import cli_context
from dankserve.cli.options import complete_deployment
from dankserve.errors import DankserveError, InvalidInput
from dankserve.exitcodes import ExitCode
from dankserve.logview import Reorder, TimedLine, daemon_file_line, journal_entry, merged, parse_since, server_lines
from dankserve.settings import Settings
from dankserve.systemd.journal import SYSLOG_IDENTIFIER, daemon_identity

if TYPE_CHECKING:
    from dankserve.runtime.base import Runtime

JOURNAL_SOCKET = Path("/run/systemd/journal/socket")
RESCAN_SECONDS = 0.25
"""How often a follower looks for the server that replaces an ended one, or for more of daemon.log."""
HOLD_SECONDS = 2 * RESCAN_SECONDS
"""`-f` holds each line this long, so lines of several sources that arrive within it print in time order
(daemon.log is read every RESCAN_SECONDS: its lines come up to that late)."""

Emit = Callable[[TimedLine], None]


def journal_matches(state_dir: Path, one: str | None) -> list[str]:
    """journalctl matches (all must hold) for this daemon's entries: all of them, or one deployment's."""
    identity = [f"{key}={value}" for key, value in daemon_identity(state_dir).items()]
    return [f"SYSLOG_IDENTIFIER={SYSLOG_IDENTIFIER}", *identity, *([f"DEPLOYMENT={one}"] if one else [])]


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
        for line in merged(_previous_servers(settings, deployment, now), start, lines):
            emit(line)
        return ExitCode.OK
    journal = _journal_available()
    # A daemon under systemd logs to the journal; one started in the background (`dankserve up`
    # without the unit) writes daemon.log in the state dir: both are read where they exist.
    journal_lines = _journal_history(settings.state_dir, deployment, start, lines) if journal else []
    daemon_log = DaemonLog(_daemon_log_path(settings), deployment)
    servers = [ServerLog(runtime, name) for name, runtime in _runtimes(settings, deployment)]
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
        threads.append(threading.Thread(target=_follow_journal, args=journal_args, daemon=True))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return ExitCode.OK


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


def _journal_available() -> bool:
    return shutil.which("journalctl") is not None and JOURNAL_SOCKET.exists()


def _journalctl(state_dir: Path, deployment: str | None, *extra: str) -> list[str]:
    return ["journalctl", "--no-pager", "-o", "json", *extra, *journal_matches(state_dir, deployment)]


def _journal_history(state_dir: Path, deployment: str | None, start: datetime | None, lines: int) -> list[TimedLine]:
    extra = ["-n", str(lines)]
    if start is not None:
        extra += ["--since", start.strftime("%Y-%m-%d %H:%M:%S")]
    done = subprocess.run(_journalctl(state_dir, deployment, *extra), capture_output=True, text=True, check=False)
    return [entry for entry in map(journal_entry, done.stdout.splitlines()) if entry is not None]


def _follow_journal(state_dir: Path, deployment: str | None, emit: Emit) -> None:
    argv = _journalctl(state_dir, deployment, "-f", "-n", "0")
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for raw in proc.stdout:
            entry = journal_entry(raw)
            if entry is not None:
                emit(entry)


def _daemon_log_path(settings: Settings) -> Path:
    from dankserve.servicectl import DAEMON_LOG

    return settings.state_dir / DAEMON_LOG


@dataclass
class DaemonLog:
    """The background daemon's log file (appended to by each daemon started with `up`)."""

    path: Path
    deployment: str | None
    _read_to: int = 0

    def _wanted(self, raw: str) -> TimedLine | None:
        line = daemon_file_line(raw)
        if line is None or (self.deployment is not None and line.deployment != self.deployment):
            return None
        return line

    def history(self) -> list[TimedLine]:
        try:
            data = self.path.read_bytes()
        except OSError:
            return []
        self._read_to = data.rfind(b"\n") + 1  # a last line still being written is read by follow
        raws = data[: self._read_to].decode("utf-8", "replace").splitlines()
        return [line for line in map(self._wanted, raws) if line is not None]

    def follow(self, emit: Emit) -> None:
        """Print each line written after the history, as it comes; also once the file first appears."""
        pending = b""
        while True:
            try:
                with self.path.open("rb") as handle:
                    handle.seek(self._read_to)
                    chunk = handle.read()
            except OSError:
                chunk = b""
            if chunk:
                self._read_to += len(chunk)
                *complete, pending = (pending + chunk).split(b"\n")
                for raw in complete:
                    line = self._wanted(raw.decode("utf-8", "replace"))
                    if line is not None:
                        emit(line)
            else:
                time.sleep(RESCAN_SECONDS)


def ended_lines(runtime: Runtime, deployment: str, now: datetime, last: int | None = None) -> list[TimedLine]:
    """The lines of the deployment's ended servers the runtime kept (or of the `last` few), each labelled
    with its place before the running one: `dankserve-NAME[-1]` the last to end."""
    from dankserve.runtime.base import workload_name

    with contextlib.suppress(DankserveError, OSError):
        servers = runtime.ended_servers(deployment)
        chosen = servers[-last:] if last else servers
        out: list[TimedLine] = []
        for back, server in zip(range(len(chosen), 0, -1), chosen, strict=True):
            stored, texts = _unzip(list(server.lines))
            out += server_lines(f"{workload_name(deployment)}[-{back}]", texts, now, stored, deployment)
        return out
    return []


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


@dataclass
class ServerLog:
    """One deployment's servers, one after another: the one running now and each that replaces it."""

    runtime: Runtime
    deployment: str
    _seen: dict[str, int] = field(default_factory=dict)
    """Lines already shown per workload id (a follow stream starts from the workload's first line)."""
    _ended: set[str] = field(default_factory=set)

    def _current(self) -> tuple[str, str, bool] | None:
        """(id, name, running) of the deployment's workload now; None when it has none (or the runtime is away)."""
        with contextlib.suppress(DankserveError, OSError):
            workload = self.runtime.find(self.deployment)
            if workload is not None:
                return workload.id, workload.name, workload.running
        return None

    def history(self, now: datetime) -> list[TimedLine]:
        current = self._current()
        if current is None:
            return []
        workload_id, label, _ = current
        with contextlib.suppress(DankserveError, OSError):
            stored, texts = _unzip(list(self.runtime.timed_logs(workload_id, follow=False)))
            self._seen[workload_id] = len(texts)
            return server_lines(label, texts, now, stored, self.deployment)
        return []

    def follow(self, emit: Emit) -> None:
        """Print each new line of the deployment's server as it comes; when that server ends, go on with
        the next one the daemon starts (new workload id), from its first line."""
        while True:
            current = self._current()
            if current is None or (current[0] in self._ended and not current[2]):
                time.sleep(RESCAN_SECONDS)
                continue
            workload_id, label, _ = current
            skip = self._seen.get(workload_id, 0)
            count = 0
            with contextlib.suppress(DankserveError, OSError):
                for at, text in self.runtime.timed_logs(workload_id, follow=True):
                    count += 1
                    if count > skip:
                        stamp = at.astimezone() if at is not None else datetime.now().astimezone()
                        emit(TimedLine(stamp, label, text, self.deployment))
            self._seen[workload_id] = max(skip, count)
            self._ended.add(workload_id)
            time.sleep(RESCAN_SECONDS)


def _unzip(pairs: list[tuple[datetime | None, str]]) -> tuple[list[datetime | None], list[str]]:
    return [at for at, _ in pairs], [text for _, text in pairs]
