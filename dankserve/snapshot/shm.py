"""The server's shared-memory segments, kept with its snapshot (issue 41).

A tree restored by CRIU opens its files again by path, and CRIU's images hold what the processes had
in memory, not a shared file's contents: a /dev/shm segment (vLLM's shm message queue between its API
server and engine core) must be there at restore, with the contents the captured memory expects. A
kill -9 leaves it (with what the server wrote since), a graceful stop (`down`, a restart, the daemon's
SIGTERM) and a reboot delete it. So the capture copies each segment the tree has open or mapped while
the server is asleep and idle (its requests held), and the restore puts those copies back: the same
restore then works after any stop.

Names come back from the manifest (hostile): only plain names directly under /dev/shm are used.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

SHM = Path("/dev/shm")
_MAX_SEGMENTS = 64


def segments(pids: Iterable[int], shm: Path = SHM) -> tuple[str, ...]:
    """The names of the files under `shm` the processes have open or mapped (sorted, bounded)."""
    found: set[str] = set()
    prefix = f"{shm}/"
    for pid in pids:
        paths: list[str] = []
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    paths.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
            paths += [line.split(None, 5)[5].strip() for line in maps if len(line.split(None, 5)) == 6]
        for path in paths:
            name = path.removeprefix(prefix)
            if path.startswith(prefix) and valid_name(name):
                found.add(name)
    return tuple(sorted(found))[:_MAX_SEGMENTS]


def valid_name(name: str) -> bool:
    """A plain file name (no directory, no `..`, not a deleted file's ` (deleted)`)."""
    return bool(name) and "/" not in name and name not in (".", "..") and not name.endswith(" (deleted)")


def save(names: Iterable[str], into: Path, shm: Path = SHM) -> tuple[str, ...]:
    """Copies the segments into `into` (0700); the names copied."""
    into.mkdir(mode=0o700, exist_ok=True)
    saved = []
    for name in names:
        if not valid_name(name):
            continue
        with contextlib.suppress(FileNotFoundError):
            shutil.copy2(shm / name, into / name, follow_symlinks=False)
            saved.append(name)
    return tuple(saved)


def put_back(names: Iterable[str], saved: Path, shm: Path = SHM) -> None:
    """Each saved segment back at its path (replacing what a killed server left: the captured memory
    expects the captured contents), 0600, through a temporary file renamed into place."""
    for name in names:
        if not valid_name(name):
            raise ValueError(f"{name!r} is not a shared-memory segment's name")
        source = saved / name
        if source.is_symlink() or not source.is_file():
            raise FileNotFoundError(f"the snapshot's copy of /dev/shm/{name} is missing")
        tmp = shm / f".{name}.dankserve-restore"
        shutil.copyfile(source, tmp, follow_symlinks=False)
        os.chmod(tmp, 0o600)
        os.replace(tmp, shm / name)
