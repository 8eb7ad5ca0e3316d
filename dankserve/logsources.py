"""The daemon's and the servers' log lines as `dankserve logs` and the web console read them (one owner):
the journal's entries of this daemon, the background daemon's log file, each deployment's running
server (and each that replaces it) and the ended servers the runtime kept. Edges over the pure
`logview`; every follower takes a `stop` event so a console page that closes ends its readers.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from dankserve.errors import DankserveError
from dankserve.logview import TimedLine, daemon_file_line, journal_entry, merged, server_lines
from dankserve.systemd.journal import SYSLOG_IDENTIFIER, daemon_identity

if TYPE_CHECKING:
    from dankserve.runtime.base import Runtime

DAEMON_LOG = "daemon.log"
"""A daemon started in the background (`up` without the unit) writes its lines here, in the state dir."""
JOURNAL_SOCKET = Path("/run/systemd/journal/socket")
RESCAN_SECONDS = 0.25
"""How often a follower looks for the server that replaces an ended one, or for more of daemon.log."""

Emit = Callable[[TimedLine], None]
Follow = Callable[[Callable[[str], None], threading.Event], None]
"""`follow(emit, stop)`: each JSON line from now on to `emit`, from threads of its own, until `stop` is set."""


def journal_matches(state_dir: Path, one: str | None) -> list[str]:
    """journalctl matches (all must hold) for this daemon's entries: all of them, or one deployment's."""
    identity = [f"{key}={value}" for key, value in daemon_identity(state_dir).items()]
    return [f"SYSLOG_IDENTIFIER={SYSLOG_IDENTIFIER}", *identity, *([f"DEPLOYMENT={one}"] if one else [])]


def journal_available() -> bool:
    return shutil.which("journalctl") is not None and JOURNAL_SOCKET.exists()


def _journalctl(state_dir: Path, deployment: str | None, *extra: str) -> list[str]:
    return ["journalctl", "--no-pager", "-o", "json", *extra, *journal_matches(state_dir, deployment)]


def journal_history(state_dir: Path, deployment: str | None, start: datetime | None, lines: int) -> list[TimedLine]:
    extra = ["-n", str(lines)]
    if start is not None:
        extra += ["--since", start.strftime("%Y-%m-%d %H:%M:%S")]
    done = subprocess.run(_journalctl(state_dir, deployment, *extra), capture_output=True, text=True, check=False)
    return [entry for entry in map(journal_entry, done.stdout.splitlines()) if entry is not None]


def follow_journal(state_dir: Path, deployment: str | None, emit: Emit, stop: threading.Event | None = None) -> None:
    argv = _journalctl(state_dir, deployment, "-f", "-n", "0")
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for raw in proc.stdout:
            if stop is not None and stop.is_set():
                proc.terminate()
                break
            entry = journal_entry(raw)
            if entry is not None:
                emit(entry)


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

    def follow(self, emit: Emit, stop: threading.Event | None = None) -> None:
        """Print each line written after the history, as it comes; also once the file first appears."""
        pending = b""
        while stop is None or not stop.is_set():
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

    def follow(self, emit: Emit, stop: threading.Event | None = None) -> None:
        """Print each new line of the deployment's server as it comes; when that server ends, go on with
        the next one the daemon starts (new workload id), from its first line. `stop` ends it at its next
        line or rescan (a server that writes nothing holds the thread until it writes or ends)."""
        while stop is None or not stop.is_set():
            current = self._current()
            if current is None or (current[0] in self._ended and not current[2]):
                time.sleep(RESCAN_SECONDS)
                continue
            workload_id, label, _ = current
            skip = self._seen.get(workload_id, 0)
            count = 0
            with contextlib.suppress(DankserveError, OSError):
                for at, text in self.runtime.timed_logs(workload_id, follow=True):
                    if stop is not None and stop.is_set():
                        return
                    count += 1
                    if count > skip:
                        stamp = at.astimezone() if at is not None else datetime.now().astimezone()
                        emit(TimedLine(stamp, label, text, self.deployment))
            self._seen[workload_id] = max(skip, count)
            self._ended.add(workload_id)
            time.sleep(RESCAN_SECONDS)


def _unzip(pairs: list[tuple[datetime | None, str]]) -> tuple[list[datetime | None], list[str]]:
    return [at for at, _ in pairs], [text for _, text in pairs]


@dataclass(frozen=True)
class LogFeed:
    """What the web console reads: one deployment's lines or all of them, as `dankserve logs` merges them,
    each line one JSON object (`TimedLine.as_json`: the page puts its fields into the page as text)."""

    state_dir: Path
    runtimes: Callable[[], Mapping[str, Runtime]]
    """Each deployment's runtime now (after reloads)."""

    def deployments(self) -> list[str]:
        return sorted(self.runtimes())

    def _servers(self, deployment: str | None) -> list[ServerLog]:
        runtimes = self.runtimes()
        names = [deployment] if deployment is not None else sorted(runtimes)
        return [ServerLog(runtimes[name], name) for name in names if name in runtimes]

    def tail(
        self, deployment: str | None, lines: int
    ) -> tuple[list[str], Callable[[Callable[[str], None], threading.Event], None]]:
        """The last `lines` lines, oldest first, and what follows on from exactly there: `follow(emit, stop)`
        emits each line written after them, from threads of its own, until `stop` is set."""
        now = datetime.now().astimezone()
        journal = journal_available()
        journal_lines = journal_history(self.state_dir, deployment, None, lines) if journal else []
        daemon_log = DaemonLog(self.state_dir / DAEMON_LOG, deployment)
        servers = self._servers(deployment)
        ended = [ended_lines(s.runtime, s.deployment, now) for s in servers]
        histories = [journal_lines, daemon_log.history(), *(s.history(now) for s in servers)]
        history = [line.as_json() for line in merged([*histories, *ended], None, lines)]

        def follow(emit: Callable[[str], None], stop: threading.Event) -> None:
            def send(line: TimedLine) -> None:
                emit(line.as_json())

            followers: list[Callable[[], None]] = [lambda: daemon_log.follow(send, stop)]
            followers += [partial(server.follow, send, stop) for server in servers]
            if journal:
                followers.append(partial(follow_journal, self.state_dir, deployment, send, stop))
            for target in followers:
                threading.Thread(target=target, daemon=True, name="console-logs").start()

        return history, follow
