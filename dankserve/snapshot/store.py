"""The snapshot store: one directory per deployment under `state_dir/snapshots` (root's, 0700).

An entry is `NAME/images/` (CRIU's files) and `NAME/manifest.json`, written atomically and last:
an entry without a readable manifest is incomplete and never restored. Everything read here is
treated as hostile (a symlink, another owner, a huge or truncated manifest): such an entry is
listed with its reason and removable, never followed or trusted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dankserve.errors import EnvironmentUnusable, InvalidInput, NotTheDaemonsUser
from dankserve.snapshot.eviction import StoredSnapshot, to_evict

SNAPSHOTS_DIR = "snapshots"
MANIFEST = "manifest.json"
MANIFEST_SCHEMA = 1
_MANIFEST_MAX_BYTES = 1 << 20
_MAX_FILES = 100_000
EntryState = Literal["ready", "incomplete", "corrupt"]
PREVIOUS = "@previous"
"""The suffix of an entry kept aside for an upgrade's rollback: `NAME@previous`, the snapshot of the image
before the switch (its manifest still names NAME: it is that deployment's)."""


def previous(name: str) -> str:
    """The entry kept aside for `name`'s rollback."""
    return name + PREVIOUS


def owner(name: str) -> str:
    """The deployment an entry belongs to (`NAME@previous` is NAME's)."""
    return name.removesuffix(PREVIOUS)


@dataclass(frozen=True, slots=True)
class Entry:
    """One deployment's snapshot as `dankserve snapshot list` shows it."""

    deployment: str
    state: EntryState
    path: Path
    bytes: int
    captured_at: float | None
    last_used: float | None
    last_restore_seconds: float | None
    reason: str | None = None


def store_root(state_dir: Path) -> Path:
    return state_dir / SNAPSHOTS_DIR


def check_root(root: Path, *, create: bool = False) -> bool:
    """False when the store does not exist (and `create` is off); raises when it is not safe: a
    symlink, not a directory, not ours, or open to others (it holds the servers' secrets)."""
    if create:
        root.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            root.mkdir(mode=0o700)
    try:
        st = root.lstat()
    except FileNotFoundError:
        return False
    except PermissionError:
        # Another user's state dir (the daemon's, 0700): its store is not this user's to read or change.
        raise NotTheDaemonsUser(
            f"the snapshot store {root} cannot be read by uid {os.geteuid()}: its state dir is another user's"
        ) from None
    problem = None
    fix = f"remove it (`rm -rf {root}`) or make it a 0700 directory of this user"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory (or is a symlink)"
    elif st.st_uid != os.geteuid():
        problem = f"belongs to uid {st.st_uid}, not {os.geteuid()}"
        if os.geteuid() != 0 and not st.st_mode & 0o077:
            # A private store of someone else (root's daemon, as a rule): a user error, not a planted one.
            fix = NotTheDaemonsUser.FIX
    elif st.st_mode & 0o077:
        problem = f"has mode {stat.S_IMODE(st.st_mode):04o}: others may read the servers' memory"
    if problem:
        raise EnvironmentUnusable(f"the snapshot store {root} {problem}", fix=fix)
    return True


def _tree_bytes(path: Path) -> int:
    """Bytes of the regular files under `path`, never following a symlink, bounded in count."""
    total = 0
    seen = 0
    for dirpath, _dirs, files in os.walk(path, followlinks=False):
        for name in files:
            seen += 1
            if seen > _MAX_FILES:
                return total
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def _number(data: dict[str, Any], key: str, *, optional: bool = False) -> float | None:
    value = data.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e12:
        raise ValueError(f"{key} is not a number of seconds")
    return float(value)


def read_entry(root: Path, name: str) -> Entry:
    """One entry, whatever its state; never raises for hostile contents."""
    path = root / name
    try:
        st = path.lstat()
    except OSError as exc:
        return Entry(name, "corrupt", path, 0, None, None, None, f"unreadable: {exc.strerror}")
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return Entry(name, "corrupt", path, 0, None, None, None, "not a directory (a symlink or a file)")
    if st.st_uid != os.geteuid():
        return Entry(name, "corrupt", path, 0, None, None, None, f"belongs to uid {st.st_uid}")
    size = _tree_bytes(path)
    manifest = path / MANIFEST
    try:
        mst = manifest.lstat()
    except FileNotFoundError:
        return Entry(name, "incomplete", path, size, None, None, None, "no manifest: the capture did not finish")
    except OSError as exc:
        return Entry(name, "corrupt", path, size, None, None, None, f"manifest unreadable: {exc.strerror}")
    if not stat.S_ISREG(mst.st_mode) or mst.st_uid != os.geteuid() or mst.st_size > _MANIFEST_MAX_BYTES:
        return Entry(name, "corrupt", path, size, None, None, None, "manifest is not a small regular file of ours")
    try:
        data = json.loads(manifest.read_bytes()[:_MANIFEST_MAX_BYTES])
        if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA or data.get("deployment") != owner(name):
            raise ValueError("not a manifest of this deployment")
        captured = _number(data, "captured_at")
        used = _number(data, "last_used")
        restore = _number(data, "last_restore_seconds", optional=True)
    except (OSError, ValueError, RecursionError) as exc:
        return Entry(name, "corrupt", path, size, None, None, None, f"manifest corrupt: {exc}"[:200])
    return Entry(name, "ready", path, size, captured, used, restore)


def list_entries(root: Path) -> tuple[Entry, ...]:
    if not check_root(root):
        return ()
    names = sorted(os.listdir(root))[:_MAX_FILES]
    return tuple(read_entry(root, n) for n in names if not n.startswith("."))


def write_manifest(root: Path, name: str, manifest: dict[str, Any]) -> None:
    """The manifest, atomically (temporary file, fsync, rename): the last step of a capture."""
    path = root / name
    tmp = path / f".{MANIFEST}.tmp"
    body = json.dumps({"schema": MANIFEST_SCHEMA, "deployment": name, **manifest}, sort_keys=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path / MANIFEST)


def record_restore(root: Path, name: str, *, seconds: float, now: float) -> None:
    """After a restore: its seconds and the entry's last use (the eviction's order)."""
    entry = read_entry(root, name)
    if entry.state != "ready":
        raise InvalidInput(f"no ready snapshot of {name!r}: {entry.reason}")
    data = json.loads((entry.path / MANIFEST).read_bytes()[:_MANIFEST_MAX_BYTES])
    data.update(last_restore_seconds=seconds, last_used=now)
    write_manifest(root, name, {k: v for k, v in data.items() if k not in ("schema", "deployment")})


def remove(root: Path, name: str) -> bool:
    """Deletes one entry (a symlink is unlinked, never followed); False when there was none."""
    if "/" in name or name in ("", ".", "..") or name.startswith("."):
        raise InvalidInput(f"{name!r} is not a deployment name", fix="use a name `dankserve snapshot list` shows")
    if not check_root(root):
        return False
    path = root / name
    try:
        st = path.lstat()
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        path.unlink()
    return True


def move(root: Path, source: str, target: str) -> None:
    """Renames one entry (a single rename: never half moved); an entry at `target` is deleted first."""
    for name in (source, target):
        if "/" in name or name in ("", ".", "..") or name.startswith("."):
            raise InvalidInput(f"{name!r} is not a deployment name", fix="use a name `dankserve snapshot list` shows")
    remove(root, target)
    os.rename(root / source, root / target)


def evict(root: Path, *, max_bytes: int, incoming_bytes: int = 0, keep: str | None = None) -> tuple[str, ...]:
    """Deletes the least recently used entries until the rest and `incoming_bytes` fit; entries
    that are not ready (no last use) go first. Returns the deleted names."""
    entries = list_entries(root)
    stored = tuple(StoredSnapshot(e.deployment, e.bytes, e.last_used or 0.0) for e in entries)
    chosen = to_evict(stored, max_bytes=max_bytes, incoming_bytes=incoming_bytes, keep=keep)
    for name in chosen:
        remove(root, name)
    return chosen
