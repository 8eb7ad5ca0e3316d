"""The CRIU edge: dump a process tree into a directory and restore it from one.

Thin: runs the `criu` binary (docs/snapshots.md; >= 4.2, `make system-deps`), bounded in time, and
turns a failure into a typed error carrying CRIU's own reason (the last error line of its log).
Which tree, where the directory lives and whether a snapshot is valid are decided elsewhere.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from dankserve.errors import EnvironmentUnusable, MissingTool

# What CRIU needs to dump a vLLM server's tree (FACTS: "Snapshots"; docs/hardware/h200x1-snapshot): its TCP
# sockets in any state; the POSIX semaphores vLLM opens under a temporary name and renames (`--link-remap`);
# the engine core's loopback connection to the API server, both ends in the frozen tree, so no iptables lock
# is needed (`--network-lock skip`: GPU hosts such as Firecracker VMs have no iptables).
_TCP = ("--tcp-established", "--link-remap", "--network-lock", "skip")
_LOG_TAIL_BYTES = 64 * 1024
_INSTALLED = ("/usr/local/sbin/criu", "/usr/sbin/criu")
_TASK_ERROR = re.compile(r"^\d+: Error ")
_SUMMARY = re.compile(r"\d+ exited, status=")


class CriuMissing(MissingTool):
    """No criu binary where dankserve looks."""


class CriuFailed(EnvironmentUnusable):
    """`criu dump` or `criu restore` failed or did not finish; `reason` is CRIU's own words."""

    def __init__(self, action: str, reason: str, log: Path | None) -> None:
        where = f" (log: {log})" if log is not None else ""
        super().__init__(
            f"criu {action} failed: {reason}{where}",
            fix="run `criu check` as root; see docs/snapshots.md for CRIU's limits",
        )
        self.action = action
        self.reason = reason


CRIU_ENV = "DANKSERVE_CRIU"
"""Names the criu binary to use (a non-standard install; tests point it at nothing: CRIU missing)."""


def criu_path() -> str | None:
    """The criu binary: DANKSERVE_CRIU when set, else PATH first, then where `make system-deps` installs
    it (root's PATH may lack /usr/local/sbin under some service managers)."""
    named = os.environ.get(CRIU_ENV)
    if named is not None:
        return named if named and os.access(named, os.X_OK) else None
    return shutil.which("criu") or next((p for p in _INSTALLED if os.access(p, os.X_OK)), None)


def criu_version(binary: str) -> str | None:
    """`criu --version`'s version (None when it does not answer)."""
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"Version:\s*(\S+)", done.stdout)
    return found.group(1) if done.returncode == 0 and found else None


def find_criu() -> str:
    """The criu binary, or CriuMissing with the fix."""
    found = criu_path()
    if found is None:
        raise CriuMissing("criu is not installed", fix="run `make system-deps` as root (builds CRIU 4.2.1)")
    return found


def dump(
    pid: int,
    images: Path,
    *,
    leave_running: bool = True,
    criu: str | None = None,
    timeout_s: float = 300.0,
    options: Sequence[str] = (),
) -> None:
    """Dumps the tree rooted at `pid` into `images` (an existing, empty directory). `options`: more of
    CRIU's own (e.g. `--ghost-limit 64M` for a server with large deleted files still open)."""
    args = ["dump", "-t", str(pid), "-D", str(images), *_TCP, "-o", "dump.log", "-v2", *options]
    if leave_running:
        args.append("--leave-running")
    _run(criu, "dump", args, images / "dump.log", timeout_s)


def restore(
    images: Path,
    *,
    criu: str | None = None,
    timeout_s: float = 300.0,
    appended: Sequence[Path] = (),
    options: Sequence[str] = (),
) -> int:
    """Restores the tree in `images`, detached; returns its root's pid. `appended`: files the tree writes
    that grew since the dump (its log): handed to it opened for appending (`--inherit-fd`), since CRIU
    refuses a regular file whose size changed."""
    pidfile = images / "restore.pid"
    pidfile.unlink(missing_ok=True)
    args = ["restore", "-D", str(images), "-d", *_TCP, "--pidfile", str(pidfile), "-o", "restore.log", "-v2"]
    args += options
    fds: list[int] = []
    try:
        for path in appended:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
            fds.append(fd)
            args += ["--inherit-fd", f"fd[{fd}]:{str(path.absolute()).lstrip('/')}"]
        _run(criu, "restore", args, images / "restore.log", timeout_s, pass_fds=tuple(fds))
    except OSError as exc:
        raise CriuFailed("restore", f"cannot open {exc.filename}: {exc.strerror}", None) from exc
    finally:
        for fd in fds:
            os.close(fd)
    try:
        text = pidfile.read_bytes()[:32].decode("ascii", errors="replace").strip()
        return int(text)
    except (OSError, ValueError) as exc:
        raise CriuFailed("restore", f"no pid in {pidfile}: {exc}", images / "restore.log") from exc


def _run(
    criu: str | None, action: str, args: list[str], log: Path, timeout_s: float, *, pass_fds: tuple[int, ...] = ()
) -> None:
    binary = criu or find_criu()
    try:
        done = subprocess.run(
            [binary, *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            check=False,
            pass_fds=pass_fds,
        )
    except subprocess.TimeoutExpired as exc:
        raise CriuFailed(action, f"did not finish in {timeout_s:g} s", log) from exc
    except OSError as exc:
        raise CriuFailed(action, f"could not run {binary}: {exc}", None) from exc
    if done.returncode != 0:
        said = (done.stderr or b"")[-_LOG_TAIL_BYTES:].decode(errors="replace")
        raise CriuFailed(action, _reason(log, said) or f"exit status {done.returncode}", log)


def _reason(log: Path, said: str) -> str:
    """The last error line of CRIU's log (read bounded: the log is CRIU's, but may be huge)."""
    text = said
    try:
        with log.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - _LOG_TAIL_BYTES))
            text = f.read().decode(errors="replace") + "\n" + said
    except OSError:
        pass
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    known = [ln for ln in lines if any(pattern.search(ln) for pattern, _ in _EXPLAINED)]
    if known:  # a cause said in the user's terms wins over the summary lines after it
        return _explained(known[0])[:500]
    # CRIU ends with "Restoring FAILED." after its own summary ("PID exited, status=1"); the cause is the
    # first error a restored task logged ("PID: Error (...): File X has bad size ...") when there is one.
    errors = [ln for ln in lines if ("Error" in ln or "error" in ln) and "FAILED" not in ln]
    tasks = [ln for ln in errors if _TASK_ERROR.match(ln)]
    causes = tasks[:1] or [ln for ln in errors if not _SUMMARY.search(ln)][-1:] or errors[-1:] or lines[-1:]
    line = causes[0] if causes else ""
    return _explained(line)[:500]


# CRIU's words for the failures a restore meets in practice, said in the user's terms (its line kept).
_EXPLAINED = (
    (re.compile(r"Can't fork for (\d+): File exists"), "pid {0} is taken by another process"),
    (re.compile(r"File (\S+) has bad size"), "the file /{0} changed size since the capture"),
    (re.compile(r"Can't open file (\S+)"), "the file /{0} is gone since the capture"),
    (
        re.compile(r"No space left on device"),
        "the disk holding the snapshot store is full (was the server asleep? see docs/snapshots.md, Disk)",
    ),
    (
        re.compile(r"Can't link remap to (\S+): File exists"),
        "a link_remap file another dump or a failed restore left in /dev/shm is in the way (of {0}): remove"
        " /dev/shm/link_remap.* that no restore is using",
    ),
)


def _explained(line: str) -> str:
    for pattern, words in _EXPLAINED:
        found = pattern.search(line)
        if found:
            return f"{words.format(*found.groups())} ({line})"
    return line
