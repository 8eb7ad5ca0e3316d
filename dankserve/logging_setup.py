"""Configure structlog for the daemon and the CLI: journald fields, readable lines, or JSON lines.

`log_format` (the setting, or `--log-format`):

- `journald`: journald's native protocol with fields (DEPLOYMENT=, PHASE=, CONTAINER_ID= ...),
  when a journald listens; else readable lines.
- `console`: readable `time level event key=value` lines on stderr (coloured on a terminal).
- `json`: one JSON object per line on stderr.
- `auto`: journald when a journald listens *and* our stderr already goes to the journal
  (systemd's `$JOURNAL_STREAM` matches stderr: the service runs under systemd), so
  `dankserve up --foreground` in a terminal keeps readable lines; else console.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, MutableMapping
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TextIO

import structlog

from dankserve.systemd.journal import (
    JOURNAL_SOCKET,
    JournalLoggerFactory,
    daemon_identity,
    journal_fields,
    journal_reachable,
)

LogFormat = Literal["auto", "console", "json", "journald"]
EffectiveFormat = Literal["console", "json", "journald"]


def stderr_is_journal(environ: Mapping[str, str] | None = None, stream: TextIO | None = None) -> bool:
    """Whether stderr is the journal stream systemd connected ($JOURNAL_STREAM = `dev:inode` of it)."""
    env = os.environ if environ is None else environ
    value = env.get("JOURNAL_STREAM", "")
    device, _, inode = value.partition(":")
    if not device.isdigit() or not inode.isdigit():
        return False
    try:
        status = os.fstat((stream or sys.stderr).fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (status.st_dev, status.st_ino) == (int(device), int(inode))


def resolve_log_format(
    requested: LogFormat,
    *,
    journal_socket: str = JOURNAL_SOCKET,
    environ: Mapping[str, str] | None = None,
    stream: TextIO | None = None,
) -> EffectiveFormat:
    """The output a requested log format means on this host now."""
    if requested in ("console", "json"):
        return requested
    if not journal_reachable(journal_socket):
        return "console"
    if requested == "journald" or stderr_is_journal(environ, stream):
        return "journald"
    return "console"


def configure_logging(
    log_format: LogFormat = "auto",
    *,
    level: str = "info",
    journal_socket: str = JOURNAL_SOCKET,
    stream: TextIO | None = None,
    environ: Mapping[str, str] | None = None,
    state_dir: Path | None = None,
) -> EffectiveFormat:
    """Configure structlog process-wide; returns the output chosen. A daemon names its `state_dir`:
    each of its journal entries then carries it (daemon_identity), which `dankserve logs` matches."""
    out = stream if stream is not None else sys.stderr
    effective = resolve_log_format(log_format, journal_socket=journal_socket, environ=environ, stream=out)
    common: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
    ]
    logger_factory: structlog.typing.WrappedLogger
    processors: list[structlog.typing.Processor]
    if effective == "journald":
        processors = [*common, structlog.processors.format_exc_info, journal_fields]
        logger_factory = JournalLoggerFactory(journal_socket, daemon_identity(state_dir) if state_dir else None)
    elif effective == "json":
        processors = [
            *common,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ]
        logger_factory = structlog.PrintLoggerFactory(out)
    else:
        processors = [
            *common,
            local_time_ms,
            structlog.dev.ConsoleRenderer(colors=_isatty(out)),
        ]
        logger_factory = structlog.PrintLoggerFactory(out)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=logger_factory,
        cache_logger_on_first_use=False,
    )
    return effective


def local_time_ms(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: the local time to the millisecond (`2026-12-01 13:03:06.123`), which
    `dankserve logs` reads back from daemon.log (structlog's TimeStamper has no millisecond format)."""
    event_dict["timestamp"] = datetime.now().isoformat(sep=" ", timespec="milliseconds")
    return event_dict


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
