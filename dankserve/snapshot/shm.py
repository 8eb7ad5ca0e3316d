"""The server's shared-memory segments, kept with its snapshot (issue 41).

A tree restored by CRIU opens its files again by path, and CRIU's images hold what the processes had
in memory, not a shared file's contents: a /dev/shm segment (vLLM's shm message queue between its API
server and engine core) must be there at restore, with the contents the captured memory expects. A
kill -9 leaves it (with what the server wrote since), a graceful stop (`down`, a restart, the daemon's
SIGTERM) and a reboot delete it. So the capture copies each segment the tree has open or mapped while
the server is asleep and idle (its requests held), and the restore puts those copies back: the same
restore then works after any stop.

The deleted ones (vLLM's POSIX semaphores, mapped after their unlink) CRIU's `--link-remap` links back as
`link_remap.N` at the dump, and a restore consumes (unlinks) them: those this dump made are kept too, and
put back before every restore, as the segments are.

CRIU numbers its link-remap files per dump (`link_remap.1`, ...), so two dumps at once (two deployments
captured together), or a dump while a restore has put its files back, would meet each other's: `turn`
takes them one at a time on the host (an flock on a file in /dev/shm, the resource they share).

A daemon killed between the dump and the manifest (which lists the link-remap files) would leave this
dump's in /dev/shm for good: `note_dump` writes the tree's deleted inodes into the entry before the dump,
and `clear_left_dump` deletes the link-remap files of those inodes when that entry is found unfinished.

Names come back from the manifest (hostile): only plain names directly under /dev/shm are used.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from dankserve.errors import EnvironmentUnusable

SHM = Path("/dev/shm")
_MAX_SEGMENTS = 64
TURN_FILE = ".dankserve-criu.lock"
DUMP_NOTE = "dump-inodes.json"
"""In a snapshot's entry from before its dump until its manifest: the dumped tree's deleted inodes."""
_DUMP_NOTE_MAX_BYTES = 64 << 10
TURN_TIMEOUT_S = 600.0
"""How long a capture or restore waits for another's dump or restore (a real vLLM's capture: tens of seconds)."""


@contextlib.contextmanager
def turn(timeout_s: float = TURN_TIMEOUT_S, shm: Path = SHM) -> Iterator[None]:
    """This host's captures and restores one at a time (their link-remap files share /dev/shm). The lock
    file must be this user's regular file: one another local user made (/dev/shm is world-writable) is
    refused rather than waited on, with the fix."""
    path = shm / TURN_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        raise EnvironmentUnusable(f"cannot open {path}: {exc.strerror}", fix=f"remove {path}") from exc
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode):
            raise EnvironmentUnusable(f"{path} belongs to uid {st.st_uid}, not to dankserve", fix=f"remove {path}")
        end = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= end:
                    raise EnvironmentUnusable(
                        f"another capture or restore held {path} for {timeout_s:g} s",
                        fix="see `dankserve status`; a process outside dankserve holding it must let go",
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


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


def deleted_inodes(pids: Iterable[int], shm: Path = SHM) -> frozenset[int]:
    """The inodes of the deleted files under `shm` the processes still map or hold open (vLLM's POSIX
    semaphores: created, then unlinked at once). CRIU's `--link-remap` links each back as `link_remap.N`
    for the restore (`link_remaps`)."""
    found: set[int] = set()
    prefix = f"{shm}/"
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith(prefix) and parts[5].rstrip().endswith(" (deleted)"):
                    with contextlib.suppress(ValueError):
                        found.add(int(parts[4]))
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith(prefix) and target.endswith(" (deleted)"):
                        found.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
        if len(found) >= _MAX_SEGMENTS:
            break
    return frozenset(found)


def link_remaps(inodes: frozenset[int], shm: Path = SHM) -> tuple[str, ...]:
    """The `link_remap.N` files CRIU's dump made of these inodes (only this dump's: another tree's have
    other inodes; sorted, bounded)."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(shm):
            if is_link_remap(entry.name) and not entry.is_symlink():
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_ino in inodes:
                        found.append(entry.name)
    return tuple(sorted(found))[:_MAX_SEGMENTS]


def is_link_remap(name: str) -> bool:
    """CRIU's name for a deleted file linked back (`link_remap.N`)."""
    head, _, number = name.partition(".")
    return head == "link_remap" and number.isdigit() and len(number) <= 12


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


def put_back(names: Iterable[str], saved: Path, shm: Path = SHM) -> dict[str, int]:
    """Each saved segment back at its path (replacing what a killed server left: the captured memory
    expects the captured contents), with the mode it had, through a temporary file renamed into place. Returns the
    link-remap files put back, with their inodes (`clear_remaps`)."""
    put: dict[str, int] = {}
    for name in names:
        if not valid_name(name):
            raise ValueError(f"{name!r} is not a shared-memory segment's name")
        source = saved / name
        if source.is_symlink() or not source.is_file():
            raise FileNotFoundError(f"the snapshot's copy of /dev/shm/{name} is missing")
        tmp = shm / f".{name}.dankserve-restore"
        shutil.copyfile(source, tmp, follow_symlinks=False)
        os.chmod(tmp, stat.S_IMODE(source.lstat().st_mode) & 0o666)  # CRIU checks the mode it saw at the dump
        if is_link_remap(name):
            put[name] = os.stat(tmp, follow_symlinks=False).st_ino
        os.replace(tmp, shm / name)
    return put


def clear_remaps(put: dict[str, int], shm: Path = SHM) -> None:
    """After a restore: the link-remap files put back that CRIU did not consume (a failed restore) are
    deleted, so no later dump (whose numbering starts again) meets one ("File exists"); a file of that name
    that is not the one put back is another's and is left alone."""
    for name, inode in put.items():
        with contextlib.suppress(OSError):
            if os.stat(shm / name, follow_symlinks=False).st_ino == inode:
                os.unlink(shm / name)


def note_dump(entry: Path, inodes: frozenset[int]) -> None:
    """Before a dump (under `turn`): the inodes whose link-remap files it will make, in the entry (0600)."""
    fd = os.open(entry / DUMP_NOTE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(sorted(inodes), out)


def dump_noted(entry: Path) -> None:
    """The manifest lists the link-remap files now: the note goes (a later dump of the restored tree makes
    files of the same inodes, which a stale note must not name)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(entry / DUMP_NOTE)


def clear_left_dump(entry: Path, shm: Path = SHM) -> tuple[str, ...]:
    """An unfinished entry's dump (under `turn`, before the entry is deleted): the link-remap files of its
    noted inodes are deleted; their names. The note is the entry's (hostile once on disk): bounded, a list of
    integers, else ignored."""
    try:
        fd = os.open(entry / DUMP_NOTE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return ()
    with os.fdopen(fd, "rb") as note:
        raw = note.read(_DUMP_NOTE_MAX_BYTES + 1)
    try:
        noted = json.loads(raw) if len(raw) <= _DUMP_NOTE_MAX_BYTES else None
    except ValueError:
        noted = None
    if not isinstance(noted, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in noted):
        return ()
    names = link_remaps(frozenset(noted), shm)
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(shm / name)
    return names
