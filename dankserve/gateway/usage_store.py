"""The gateway's usage counters on disk: `gateway-usage.json` under the state dir (mode 0600).

Written whole and atomically (a temporary file in the same directory, fsync, rename), so a crash
leaves the old file or the new one. A file that cannot be read as counters (corrupt, too big, of
another shape) is moved aside to `gateway-usage.json.corrupt` with a warning, and counting starts
again from zero: the gateway serves on whatever the file holds.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import structlog

from dankserve.gateway.usage import Usage

log = structlog.get_logger("dankserve.gateway")

FILE_NAME = "gateway-usage.json"
MAX_FILE_BYTES = 32 * 1024 * 1024
"""Far above what MAX_SERIES rows take (a few MB); a bigger file is not ours."""


def usage_path(state_dir: Path) -> Path:
    return state_dir / FILE_NAME


def read_usage(path: Path) -> Usage:
    """The counters in `path`, or ValueError naming why they cannot be read (missing: no counters yet)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return Usage()
    except OSError as exc:
        raise ValueError(f"cannot open it: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError("it is not a regular file (a directory, FIFO or device)")
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"it is larger than {MAX_FILE_BYTES} bytes")
    try:
        return Usage.from_json(json.loads(data))
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"it is not a usage document: {str(exc)[:200]}") from None


def load_usage(path: Path) -> Usage:
    """The counters to go on from: the file's, or none (a corrupt file moved aside, with a warning)."""
    try:
        return read_usage(path)
    except ValueError as exc:
        aside = path.with_name(path.name + ".corrupt")
        try:
            os.replace(path, aside)
        except OSError:
            aside = path
        log.warning("gateway_usage_unreadable", path=str(path), error=str(exc), moved_to=str(aside), counting="from 0")
        return Usage()


def write_usage(path: Path, document: dict[str, object]) -> None:
    """Replace `path` with `document` atomically, mode 0600."""
    data = json.dumps(document, separators=(",", ":")).encode()
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
