"""Whether the code root's units run can be changed by someone other than root (`install`, `doctor`).

dankserve.service and the daily dankserve-auto-update.service run as root whatever user installed
them: their `ExecStart=` executable, the interpreter in its `#!` line, every directory on that
interpreter's `sys.path` (the standard library, site-packages) and the dankserve package it imports
(an editable install's source tree) are root's code. A user who owns or may write any of them, or a
directory above them, runs code as root at the next start or the next day's update. So each is
asked of the interpreter itself (isolated, `-I`: what the unit gets, without this shell's
PYTHONPATH), then checked: owned by root, writable by no one else (a group only when it is root's),
and the same for every directory on the way, symlinks followed as the kernel follows them.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dankserve.file_trust import lookups

MAX_ENTRIES = 400_000
"""Entries looked at in one check at most (a venv with torch holds ~60k): past it, the check says so."""
SHOWN = 8
"""Problems listed in a message; the rest are counted."""

_PROBE = (
    "import json, sys, sysconfig, dankserve\n"
    "print(json.dumps({'path': [p for p in sys.path if p], 'package': dankserve.__path__[0],"
    " 'libdir': sysconfig.get_config_var('LIBDIR') or ''}))"
)


@dataclass(frozen=True)
class CodePaths:
    """What one `dankserve` executable runs: itself, its interpreter, the import path and the package."""

    executable: Path
    interpreter: Path
    import_path: tuple[Path, ...]
    """Directories on the interpreter's sys.path that exist (zip files and path hooks left out)."""
    package: Path
    """The dankserve package the interpreter imports (an editable install: the source tree)."""
    libdir: Path | None
    """Where libpython lives (its files, not its subdirectories, are checked)."""


class CodeUnreadable(Exception):
    """The executable's interpreter could not say what it runs."""


def interpreter_of(executable: Path) -> Path:
    """The interpreter named by a console script's `#!` line (the executable itself when it has none).

    A `#!` line ends at the first blank, so pip writes a script whose interpreter's path holds one as a
    /bin/sh trampoline: `#!/bin/sh`, then `'''exec' "/path with blank/python" "$0" "$@"`."""
    try:
        with executable.open("rb") as handle:
            head = handle.read(8192).decode("utf-8", "replace").splitlines()
    except OSError as exc:
        raise CodeUnreadable(f"cannot read {executable}: {exc.strerror or exc}") from None
    if not head or not head[0].startswith("#!"):
        return executable
    words = head[0][2:].split()
    if not words:
        raise CodeUnreadable(f"{executable} has an empty #! line")
    if words[0] == "/bin/sh" and len(head) > 1 and head[1].startswith("'''exec'"):
        try:
            trampoline = shlex.split(head[1])
        except ValueError:
            trampoline = []
        if len(trampoline) > 1:
            return Path(trampoline[1])
    return Path(words[0])


def code_paths(executable: Path) -> CodePaths:
    """Ask the executable's interpreter, isolated as the unit runs it, what it imports."""
    interpreter = interpreter_of(executable)
    try:
        done = subprocess.run(
            [str(interpreter), "-I", "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CodeUnreadable(f"cannot run {interpreter}: {exc}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise CodeUnreadable(f"{interpreter} cannot import dankserve without this shell's environment: {last}")
    found = json.loads(done.stdout)
    dirs = tuple(Path(p) for p in found["path"] if os.path.isdir(p))
    libdir = Path(found["libdir"]) if found["libdir"] and os.path.isdir(found["libdir"]) else None
    return CodePaths(executable, interpreter, dirs, Path(found["package"]), libdir)


def root_only_problem(info: os.stat_result, *, sticky_entry_owner: int | None = None) -> str | None:
    """Why a file or directory of root's code could be changed by someone other than root, or None.

    `sticky_entry_owner`: for a directory on the way, the owner of the entry looked up in it (a sticky
    directory such as /tmp others may write, but only root may then rename root's entry)."""
    if info.st_uid != 0:
        return f"is owned by uid {info.st_uid}, not root"
    if stat.S_ISLNK(info.st_mode):
        return None  # a link's own mode means nothing; what it names is checked where it is followed
    writable = info.st_mode & (0o002 | (0o020 if info.st_gid != 0 else 0))
    if not writable:
        return None
    if stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX and sticky_entry_owner == 0:
        return None
    who = " and ".join(w for bit, w in ((0o020, f"its group (gid {info.st_gid})"), (0o002, "others")) if writable & bit)
    return f"is writable by {who} (mode {stat.S_IMODE(info.st_mode):04o})"


@dataclass
class _Findings:
    problems: list[str]
    looked_at: int = 0

    def note(self, path: str, problem: str | None) -> None:
        if problem is not None:
            self.problems.append(f"{path} {problem}")


def _check_way(path: Path, found: _Findings) -> None:
    """`path` itself and every directory on its way."""
    try:
        steps, entry = lookups(path)
    except OSError as exc:
        found.problems.append(f"{path} cannot be looked at ({exc.strerror or exc})")
        return
    for directory, info, looked_up in steps:
        found.note(directory, root_only_problem(info, sticky_entry_owner=looked_up.st_uid))
    found.note(str(path), root_only_problem(entry))


def _check_tree(top: Path, found: _Findings, *, depth: int | None = None) -> None:
    """Every entry below `top` (not following links; `depth` 1: its entries only)."""
    pending = [(str(top), 0)]
    while pending:
        directory, level = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue  # not a directory, or gone: its own entry was checked by its parent
        for item in entries:
            found.looked_at += 1
            if found.looked_at > MAX_ENTRIES:
                return
            try:
                info = item.stat(follow_symlinks=False)
            except OSError:
                continue
            found.note(item.path, root_only_problem(info))
            if stat.S_ISDIR(info.st_mode) and (depth is None or level + 1 < depth):
                pending.append((item.path, level + 1))


def _outermost(dirs: tuple[Path, ...]) -> list[Path]:
    """The directories not inside another of them (lib-dynload inside the standard library is walked once)."""
    real = sorted({Path(os.path.realpath(d)) for d in dirs})
    return [d for d in real if not any(other != d and other in d.parents for other in real)]


def code_problems(paths: CodePaths) -> list[str]:
    """Every place of `paths` someone other than root could change (empty: root's alone)."""
    found = _Findings([])
    for path in (paths.executable, paths.interpreter, *paths.import_path, paths.package):
        _check_way(path, found)
    for directory in _outermost((*paths.import_path, paths.package)):
        _check_tree(directory, found)
    if paths.libdir is not None:
        _check_way(paths.libdir, found)
        _check_tree(paths.libdir, found, depth=1)
    if found.looked_at > MAX_ENTRIES:
        found.problems.append(f"(more than {MAX_ENTRIES} files: the rest were not checked)")
    return list(dict.fromkeys(found.problems))


def describe(problems: list[str]) -> str:
    """The first problems, one per line, and how many more."""
    lines = [f"  {p}" for p in problems[:SHOWN]]
    if len(problems) > SHOWN:
        lines.append(f"  ... and {len(problems) - SHOWN} more")
    return "\n".join(lines)


ROOT_INSTALL_FIX = (
    "install dankserve where only root can change it, as root: `sudo git clone <repository> /opt/dankserve && "
    "sudo make -C /opt/dankserve setup && sudo /opt/dankserve/.venv/bin/dankserve install` "
    "(docs/OPERATIONS.md, section 2); or `sudo chown -R root:root` and `sudo chmod -R go-w` what is named"
)
