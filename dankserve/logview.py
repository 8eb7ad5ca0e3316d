"""Log lines with a time each, for `dankserve logs`: parse --since, read the time of a daemon
line (journald entry, JSON or console line) or of a server line, merge them in time order. Pure.

A server's line takes the time its runtime stored with it (Podman's k8s-file log: conmon's, to
the nanosecond; a process server's line-times file, to the microsecond: `runtime.logfile` owns
both forms) where there is one; else vLLM's own time prefix (`INFO 12-01 13:03:06 [file.py:N]
...`, to the second, no year); lines without either (uvicorn's, tracebacks, progress bars) take
the time of the line before them (the first ones that of the line after).
"""

from __future__ import annotations

import heapq
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from dankserve.errors import InvalidInput
from dankserve.systemd.journal import STATE_DIR_FIELD

_UNITS = {
    "s": 1,
    "sec": 1,
    "second": 1,
    "seconds": 1,
    "m": 60,
    "min": 60,
    "minute": 60,
    "minutes": 60,
    "h": 3600,
    "hour": 3600,
    "hours": 3600,
    "d": 86400,
    "day": 86400,
    "days": 86400,
}
_RELATIVE = re.compile(r"^-?\s*(\d+(?:\.\d+)?)\s*([a-z]+)(?:\s+ago)?$")
_VLLM_TIME = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)\b")
_CONSOLE_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)")
_CONSOLE_DEPLOYMENT = re.compile(r"\bdeployment=(\S+)")


@dataclass(frozen=True)
class TimedLine:
    at: datetime
    """Aware (local time zone when the source had none)."""
    source: str
    text: str
    deployment: str | None = None
    """The deployment the line is about (a server's own, or a daemon entry's DEPLOYMENT); None: the daemon's."""

    def message(self) -> str:
        # A progress bar redraws itself with carriage returns: show what a terminal would, its last state.
        return next((part for part in reversed(self.text.split("\r")) if part.strip()), "")

    def render(self) -> str:
        return f"{self.at.astimezone().strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]} {self.source}: {self.message()}"

    def as_json(self) -> str:
        """One JSON object: time (ISO 8601, milliseconds, local offset), source, deployment, message."""
        return json.dumps(
            {
                "time": self.at.astimezone().isoformat(timespec="milliseconds"),
                "source": self.source,
                "deployment": self.deployment,
                "message": self.message(),
            }
        )


def parse_since(text: str, now: datetime) -> datetime:
    """--since as journalctl reads it: a date/time (local unless it names a zone), `today`,
    `yesterday`, `now`, or a span back from now (`10m`, `-2h`, `1 day ago`)."""
    value = text.strip().lower()
    if value == "now":
        return now
    if value in ("today", "yesterday"):
        midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
        return midnight - timedelta(days=1) if value == "yesterday" else midnight
    match = _RELATIVE.match(value)
    if match and match.group(2) in _UNITS:
        return now - timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidInput(
            f"--since {text!r} is not a time",
            fix='give a date and time ("2026-12-01 13:00", ISO 8601), today, yesterday, or a span ("10m", "2h ago")',
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.astimezone()


def vllm_time(line: str, now: datetime) -> datetime | None:
    """The time of vLLM's log prefix (this year, or last year for a date after now)."""
    match = _VLLM_TIME.search(line)
    if match is None:
        return None
    month, day, hour, minute, second = (int(g) for g in match.groups())
    try:
        at = now.replace(month=month, day=day, hour=hour, minute=minute, second=second, microsecond=0)
    except ValueError:
        return None
    return at.replace(year=at.year - 1) if at > now + timedelta(days=1) else at


def server_lines(
    source: str,
    lines: Sequence[str],
    now: datetime,
    stored: Sequence[datetime | None] | None = None,
    deployment: str | None = None,
) -> list[TimedLine]:
    """A server's lines, each with its stored time (the runtime's, one per line, None where unknown),
    else the time of its own vLLM prefix, else that of its neighbour."""
    stored = stored if stored is not None else [None] * len(lines)
    times = [at.astimezone() if at else vllm_time(line, now) for line, at in zip(lines, stored, strict=True)]
    known = next((t for t in times if t is not None), now)
    out = []
    for line, at in zip(lines, times, strict=True):
        known = at or known
        out.append(TimedLine(known, source, line, deployment))
    return out


def daemon_file_line(line: str, source: str = "dankserve") -> TimedLine | None:
    """A line of the daemon's own log file (JSON or console), None when it has no time."""
    if line.startswith("{"):
        try:
            entry = json.loads(line)
            at = datetime.fromisoformat(str(entry.pop("timestamp")).replace("Z", "+00:00"))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        event = entry.pop("event", "")
        level = entry.pop("level", "info")
        deployment = entry.get("deployment")
        rest = " ".join(f"{key}={value}" for key, value in entry.items())
        text = f"[{level}] {event} {rest}".rstrip()
        return TimedLine(at.astimezone(), source, text, deployment if isinstance(deployment, str) else None)
    match = _CONSOLE_TIME.match(line)
    if match is None:
        return None
    at = datetime.fromisoformat(match.group(1)).astimezone()
    text = line[match.end() :].strip()
    named = _CONSOLE_DEPLOYMENT.search(text)
    return TimedLine(at, source, text, named.group(1) if named else None)


_JOURNAL_OWN = frozenset(
    {"MESSAGE", "PRIORITY", "SYSLOG_IDENTIFIER", "SYSLOG_FACILITY", "SYSLOG_PID", "SYSLOG_TIMESTAMP", STATE_DIR_FIELD}
)
_LEVELS = {
    "0": "emerg",
    "1": "alert",
    "2": "critical",
    "3": "error",
    "4": "warning",
    "5": "notice",
    "6": "info",
    "7": "debug",
}


def journal_entry(line: str, source: str = "dankserve") -> TimedLine | None:
    """One `journalctl -o json` entry, rendered like a daemon log line: `[level] event key=value ...`
    (the event's fields are the entry's own upper-case ones; journald's `_`-prefixed ones are left out)."""
    try:
        entry = json.loads(line)
        at = datetime.fromtimestamp(int(entry["__REALTIME_TIMESTAMP"]) / 1e6).astimezone()
    except (ValueError, KeyError, TypeError):
        return None
    message = entry.get("MESSAGE", "")
    if isinstance(message, list):  # journalctl gives non-UTF-8 messages as byte lists
        message = bytes(message).decode("utf-8", "replace")
    level = _LEVELS.get(str(entry.get("PRIORITY", "6")), "info")
    deployment = entry.get("DEPLOYMENT")
    fields = " ".join(
        f"{key.lower()}={value}"
        for key, value in entry.items()
        if not key.startswith("_") and key not in _JOURNAL_OWN and isinstance(value, str)
    )
    text = f"[{level}] {message} {fields}".rstrip()
    return TimedLine(at, source, text, deployment if isinstance(deployment, str) else None)


def merged(groups: Iterable[Iterable[TimedLine]], since: datetime | None, last: int) -> list[TimedLine]:
    """Every group's lines at or after `since`, in time order (stable), the last `last` of them."""
    lines = [line for group in groups for line in group if since is None or line.at >= since]
    lines.sort(key=lambda line: line.at)
    return lines[-last:] if last > 0 else []


class Reorder:
    """Lines that come from several followed sources, put back in time order (`logs -f`).

    Each source prints as its lines arrive, so a daemon line and a server line of the same second could show
    in the order their threads woke, not their times. A line is held for `hold` seconds after it arrived and
    given out in time order once that passed: sources whose lines arrive within `hold` of one another come out
    sorted. Pure: the caller passes the clock's reading."""

    def __init__(self, hold: float) -> None:
        self._hold = hold
        self._held: list[tuple[datetime, int, float, TimedLine]] = []
        self._count = 0

    def push(self, line: TimedLine, now: float) -> None:
        self._count += 1
        heapq.heappush(self._held, (line.at, self._count, now, line))

    def due(self, now: float) -> list[TimedLine]:
        """The lines to print now, oldest first: while the oldest held line has been held long enough."""
        out = []
        while self._held and now - self._held[0][2] >= self._hold:
            out.append(heapq.heappop(self._held)[3])
        return out

    def rest(self) -> list[TimedLine]:
        """Every line still held, oldest first (at the end)."""
        out = [entry[3] for entry in sorted(self._held)]
        self._held = []
        return out
