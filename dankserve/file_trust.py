"""Whether a file dankserve reads as root may be trusted: who owns it, and who could swap it on its way.

A file is only as safe as every directory its path goes through: whoever may write one of them can
rename the checked file away and put their own in its place between a check and a read. So a file
is opened once, its descriptor's owner and mode are checked (fstat: what is checked is what is
read), and then every directory the kernel looked a name up in on the way to it, symlinks followed
as the kernel follows them; the path must still name the file opened. The config file, secret files
(API keys, tokens), the gateway's keys_dir and its key files all go through here.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from dankserve.errors import ConfigError

MAX_SYMLINKS = 40
"""As the kernel's lookup: more symlinks on the way to a file is a loop."""


def owner_problem(owner: int, me: int) -> str | None:
    """Why a file or directory with this owner must not be trusted (neither root nor this user), or None."""
    if owner not in (0, me):
        return f"is owned by uid {owner}, neither root nor the user running dankserve (uid {me})"
    return None


def writers(mode: int) -> str:
    """Who besides the owner may write, as words: "its group", "others", "its group and others"."""
    return " and ".join(w for bit, w in ((0o020, "its group"), (0o002, "others")) if mode & bit)


def dir_problem(mode: int, owner: int, entry_owner: int, me: int) -> str | None:
    """Why a directory on the way to a trusted file lets someone else swap what is read, or None.

    Only root and the user running dankserve may own it or write it. A sticky directory (`/tmp`,
    mode 1777) is the exception where others may write: there an entry can be renamed or removed
    only by its owner, the directory's owner or root, so it is safe when all of those are root or
    this user."""
    problem = owner_problem(owner, me)
    if problem is not None:
        return problem
    if mode & 0o022:
        if mode & stat.S_ISVTX and entry_owner in (0, me):
            return None
        return f"is writable by {writers(mode)} (mode {stat.S_IMODE(mode):04o})"
    return None


def lookups(path: Path) -> tuple[list[tuple[str, os.stat_result, os.stat_result]], os.stat_result]:
    """Each directory resolving `path` looks a name up in, with its lstat and the entry's; the file's lstat.

    Symlinks are followed as the kernel follows them, so a link's directory counts as well as its
    target's. Raises OSError when a step cannot be looked at."""
    pending = [part for part in str(Path.cwd() / path).split("/") if part]
    pending.reverse()
    current = "/"
    steps: list[tuple[str, os.stat_result, os.stat_result]] = []
    links = 0
    entry = os.lstat(current)  # the path "/" itself
    while pending:
        name = pending.pop()
        if name == ".":
            continue
        if name == "..":
            current = os.path.dirname(current)
            entry = os.lstat(current)
            continue
        directory = os.lstat(current)
        candidate = os.path.join(current, name)
        entry = os.lstat(candidate)
        steps.append((current, directory, entry))
        if stat.S_ISLNK(entry.st_mode):
            links += 1
            if links > MAX_SYMLINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(path))
            target = os.readlink(candidate)
            if target.startswith("/"):
                current = "/"
            pending.extend(reversed([part for part in target.split("/") if part]))
        else:
            current = candidate
    return steps, entry


@dataclass(frozen=True)
class Untrusted:
    """Why the way to an opened file cannot be trusted."""

    problem: str
    directory: str | None = None
    """The directory on the way that others may change (None: the path as a whole)."""


def way_problem(path: Path, opened: os.stat_result) -> Untrusted | None:
    """The first directory on the way to `path` that someone other than root or this user could change,
    or a path that no longer names the file opened (`opened`: its fstat); None when the way is safe."""
    me = os.geteuid()
    try:
        steps, found = lookups(path)
    except OSError as exc:
        return Untrusted(f"the directories on its way cannot be checked ({exc.strerror or exc})")
    for directory, info, entry in steps:
        problem = dir_problem(info.st_mode, info.st_uid, entry.st_uid, me)
        if problem is not None:
            return Untrusted(problem, directory)
    if (found.st_dev, found.st_ino) != (opened.st_dev, opened.st_ino):
        return Untrusted("changed while it was read")
    return None


def check_way(path: Path, opened: os.stat_result, subject: str, swapped: str) -> None:
    """Raise the ConfigError `way_problem` calls for: `subject` names the file in the message ("config file
    /etc/x.toml"), `swapped` what someone could swap ("the config")."""
    untrusted = way_problem(path, opened)
    if untrusted is None:
        return
    where = untrusted.directory
    if where is not None:
        raise ConfigError(
            f"{subject}: the directory {where} on its way {untrusted.problem}, so someone else can swap {swapped} "
            "for their own",
            fix=f"chown root {where} && chmod go-w {where}, or keep {swapped} in a directory only root (or you) can "
            "write, such as /etc/dankserve",
        )
    if untrusted.problem.startswith("changed"):
        raise ConfigError(f"{subject} changed while it was read", fix="read it again once nothing is replacing it")
    raise ConfigError(
        f"{subject}: {untrusted.problem}",
        fix="keep it where root (or the user running dankserve) can look up every directory",
    )
