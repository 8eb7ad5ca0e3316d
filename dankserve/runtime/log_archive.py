"""The lines of a deployment's ended servers, kept when the runtime removes them (issue 39.2).

A runtime removes a server's workload before it starts the next one (a restart, a crash, `down`
then `up`): Podman deletes the container's k8s-file log with it, and the process runtime keeps only
one earlier log. So the runtime hands the ended server's lines (with their stored times) to this
archive first, and `dankserve logs` merges them with the running server's, or shows the last one
alone (`--previous`, as `kubectl logs --previous`).

Bounded: the last KEEP_SERVERS servers per deployment, each its last MAX_SERVER_BYTES of output
(a line longer than MAX_LINE_BYTES is cut), in 0600 files of a 0700 directory. One file per ended
server, `<nanoseconds when archived>-<workload id>.log`, one line each: the ISO time (or `-` where
unknown), a tab, the text.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections import deque
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from dankserve.processes import write_private_file
from dankserve.runtime.base import EndedServer

KEEP_SERVERS = 5
MAX_SERVER_BYTES = 2 * 1024 * 1024
MAX_LINE_BYTES = 16 * 1024
_SAFE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def encode_line(at: datetime | None, text: str) -> str:
    """One archived line: time (ISO 8601, or `-`), tab, text (cut to MAX_LINE_BYTES, no newline)."""
    clean = text.replace("\n", " ")
    if len(clean.encode("utf-8", "replace")) > MAX_LINE_BYTES:
        clean = clean.encode("utf-8", "replace")[:MAX_LINE_BYTES].decode("utf-8", "ignore") + " [cut]"
    return f"{at.isoformat() if at is not None else '-'}\t{clean}"


def decode_line(line: str) -> tuple[datetime | None, str]:
    """An archived line back as (time, text); a line without a readable time has none."""
    stamp, tab, text = line.partition("\t")
    if not tab:
        return None, line
    try:
        return datetime.fromisoformat(stamp), text
    except ValueError:
        return None, text


def last_bytes(lines: Iterable[tuple[datetime | None, str]], budget: int = MAX_SERVER_BYTES) -> list[str]:
    """The encoded lines, the last of them that fit in `budget` bytes (the end of a log says why it ended)."""
    kept: deque[str] = deque()
    size = 0
    for at, text in lines:
        encoded = encode_line(at, text)
        kept.append(encoded)
        size += len(encoded.encode("utf-8", "replace")) + 1
        while size > budget and kept:
            size -= len(kept.popleft().encode("utf-8", "replace")) + 1
    return list(kept)


class LogArchive:
    """The ended servers' lines of each deployment, under `directory/<deployment>/`."""

    def __init__(self, directory: Path, keep: int = KEEP_SERVERS, max_bytes: int = MAX_SERVER_BYTES) -> None:
        self.directory = directory
        self._keep = keep
        self._max_bytes = max_bytes

    def _folder(self, deployment: str) -> Path | None:
        return self.directory / deployment if _SAFE.fullmatch(deployment) else None

    def keep(self, deployment: str, workload_id: str, lines: Iterable[tuple[datetime | None, str]]) -> None:
        """Keep an ended server's lines (its last MAX_SERVER_BYTES); drop the oldest beyond KEEP_SERVERS.
        A disk that refuses costs the archive, never the removal that called it."""
        folder = self._folder(deployment)
        if folder is None:
            return
        kept = last_bytes(lines, self._max_bytes)
        if not kept:
            return
        ident = re.sub(r"[^A-Za-z0-9_-]", "_", workload_id)[:64]
        with contextlib.suppress(OSError):
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_private_file(folder / f"{time.time_ns():020d}-{ident}.log", "\n".join(kept) + "\n")
            for old in self._files(folder)[: -self._keep]:
                old.unlink(missing_ok=True)

    @staticmethod
    def _files(folder: Path) -> list[Path]:
        try:
            return sorted(p for p in folder.iterdir() if p.suffix == ".log" and p.is_file() and not p.is_symlink())
        except OSError:
            return []

    def ended(self, deployment: str) -> list[EndedServer]:
        """The deployment's ended servers, oldest first, each its kept lines (read back bounded)."""
        folder = self._folder(deployment)
        if folder is None:
            return []
        servers = []
        for path in self._files(folder)[-self._keep :]:
            try:
                with path.open("rb") as handle:
                    size = os.fstat(handle.fileno()).st_size
                    handle.seek(max(0, size - self._max_bytes - MAX_LINE_BYTES))
                    data = handle.read(self._max_bytes + MAX_LINE_BYTES)
            except OSError:
                continue
            lines = data.decode("utf-8", "replace").splitlines()
            if size > self._max_bytes + MAX_LINE_BYTES and lines:
                lines = lines[1:]  # began mid-line
            workload_id = path.stem.partition("-")[2]
            servers.append(EndedServer(workload_id, tuple(decode_line(line) for line in lines)))
        return servers
