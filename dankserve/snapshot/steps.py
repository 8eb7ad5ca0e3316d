"""Runs a snapshot sequence (sequence.py) against a server's process tree: each step timed, a failed
step's undo run best-effort, the outcome with its reason. Shared by capture.py and restore.py.

The server's own routes are the caller's (`Hooks`: the sleep, the wake and the greedy canary, e.g.
`supervisor/probes/sleep_mode.py` and the swap canary bound to the server's address): snapshot/ never
imports the supervisor.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dankserve.errors import DankserveError
from dankserve.host.gpu_processes import process_tree
from dankserve.processes import gone_or_zombie, reap_group_orphans
from dankserve.snapshot import criu, room, tcp
from dankserve.snapshot.gpu import DEFAULT_LOCK_TIMEOUT_S, GpuCheckpoint
from dankserve.snapshot.sequence import Failure, Kind, Step, canary_problem, on_failure


class StepFailed(Exception):
    """A hook's own failure (the sleep or wake route refused, the canary unanswered): its reason."""


@dataclass(frozen=True, slots=True)
class Hooks:
    """The server's routes, bound by the caller to its address and key."""

    sleep: Callable[[], None]
    wake: Callable[[], None]
    canary: Callable[[], tuple[int, ...]]


@dataclass(slots=True)
class Outcome:
    """What a sequence did: seconds per step (GPU steps summed over processes), the canary's ids,
    the server's root pid, and on failure the reason and whether the undo left anything behind."""

    kind: Kind
    pid: int | None
    timings: dict[str, float] = field(default_factory=dict)
    canary_ids: tuple[int, ...] = ()
    holders: tuple[int, ...] = ()
    failure: Failure | None = None
    undo_problems: tuple[str, ...] = ()
    remedy: str | None = None
    """The failed GPU step's remedy (gpu.py: host, deployment, retry, undo); None for any other failure."""
    server_lost: bool = False
    """A capture whose dump ended the tree and whose restore then failed: no server serves any more."""

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def reason(self) -> str | None:
        if self.failure is None:
            return None
        extra = f"; undo: {'; '.join(self.undo_problems)}" if self.undo_problems else ""
        return self.failure.message + extra


@dataclass
class Runner:
    """One sequence's interpreter."""

    kind: Kind
    gpu: GpuCheckpoint
    hooks: Hooks
    images: Path
    outcome: Outcome
    expected_ids: tuple[int, ...] = ()
    criu_binary: str | None = None
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S
    criu_timeout_s: float = 300.0
    appended: tuple[Path, ...] = ()
    """Files the tree writes that grow (its log), handed to `criu restore` (criu.restore)."""
    criu_options: tuple[str, ...] = ()
    """More of CRIU's own options, for both `dump` and `restore`."""
    room_budget_bytes: int | None = None
    """snapshot_max_bytes: an image estimated larger fails the capture before the dump (room.py)."""
    quiet_timeout_s: float = tcp.QUIET_TIMEOUT_S
    """How long the asleep server's client connections may take to close before the dump (tcp.py)."""
    clock: Callable[[], float] = time.monotonic

    def run(self, steps: Sequence[Step], done_before: Sequence[Step] = ()) -> Outcome:
        """`done_before`: steps a previous run of this sequence did (what a failure must undo)."""
        done: list[Step] = list(done_before)
        for step in steps:
            started = self.clock()
            try:
                self._do(step)
            except (DankserveError, StepFailed, OSError) as exc:
                self.outcome.failure = on_failure(self.kind, done, step, _reason(exc))
                self.outcome.remedy = getattr(exc, "remedy", None)
                self.undo(self.outcome.failure)
                return self.outcome
            finally:
                self.outcome.timings[step.name] = self.outcome.timings.get(step.name, 0.0) + self.clock() - started
            done.append(step)
        return self.outcome

    def _do(self, step: Step) -> None:
        pid = step.pid if step.pid is not None else 0
        match step.name:
            case "reference":
                self.expected_ids = self.hooks.canary()
            case "sleep":
                self.hooks.sleep()
            case "room":
                assert self.outcome.pid is not None
                problem = room.problem(process_tree(self.outcome.pid), self.images, self.room_budget_bytes)
                if problem:
                    raise StepFailed(problem)
            case "quiet":
                assert self.outcome.pid is not None
                left = tcp.wait_quiet(self.outcome.pid, self.quiet_timeout_s)
                if left:
                    raise StepFailed(tcp.describe(left))
            case "wake":
                self.hooks.wake()
            case "gpu_lock":
                self.gpu.lock(pid, self.lock_timeout_s)
            case "gpu_checkpoint":
                self.gpu.checkpoint(pid)
            case "gpu_restore":
                self.gpu.restore(pid)
            case "gpu_unlock":
                self.gpu.unlock(pid)
            case "criu_dump":
                assert self.outcome.pid is not None
                criu.dump(
                    self.outcome.pid,
                    self.images,
                    leave_running=False,  # the tree ends here: the caller restores it from the image
                    criu=self.criu_binary,
                    timeout_s=self.criu_timeout_s,
                    options=self.criu_options,
                )
            case "criu_restore":
                self.outcome.pid = criu.restore(
                    self.images,
                    criu=self.criu_binary,
                    timeout_s=self.criu_timeout_s,
                    appended=self.appended,
                    options=self.criu_options,
                )
            case "canary":
                self.outcome.canary_ids = self.hooks.canary()
                problem = canary_problem(self.expected_ids, self.outcome.canary_ids)
                if problem:
                    raise StepFailed(problem)
            case "kill_tree":
                kill_tree(self.outcome.pid)

    def undo(self, failure: Failure) -> None:
        problems = []
        for step in failure.undo:
            try:
                self._do(step)
            except (DankserveError, StepFailed, OSError) as exc:
                problems.append(f"{step.name}: {_reason(exc)}")
        self.outcome.undo_problems = tuple(problems)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, DankserveError):
        return exc.message
    return str(exc) or type(exc).__name__


def kill_tree(pid: int | None, *, wait_s: float = 10.0) -> None:
    """SIGKILL to a restored tree, children first seen, then waited until its pids are gone."""
    if pid is None:
        return
    members = process_tree(pid)
    for member in reversed(members):
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)
    # Until the pids are free (a restore needs them): a zombie still holds its pid, so ours are reaped
    # (this process may be the tree's parent or subreaper); others' parents reap theirs.
    end = time.monotonic() + wait_s
    while any(Path(f"/proc/{m}").exists() for m in members) and time.monotonic() < end:
        for member in members:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(member, os.WNOHANG)
        time.sleep(0.02)


PIDS_FREE_SECONDS = 10.0


def free_pids(pids: Sequence[int], *, wait_s: float = PIDS_FREE_SECONDS) -> list[int]:
    """Until a dumped or killed tree's host pids are free, as `criu restore` needs them (the process runtime's
    server keeps its host pids: docs/snapshots.md, "Host pids"): what is left of its process group is killed,
    our own zombies reaped, others' left to their parents (bounded). The pids still taken: at once those a
    live process outside the tree's group holds (it will not go away; the restore then fails with CRIU's
    reason and the normal boot runs)."""
    if not pids:
        return []
    root = pids[0]
    if gone_or_zombie(root):  # its group still names the dead root: what is left of the tree
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(root, signal.SIGKILL)
    end = time.monotonic() + wait_s
    while True:
        held = [p for p in pids if Path(f"/proc/{p}").exists()]
        reap_group_orphans(root)  # its workers, ours as subreaper (processes.py, "Orphans")
        for pid in held:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
        held = [p for p in held if Path(f"/proc/{p}").exists()]
        if not held or any(_stranger(p, root) for p in held) or time.monotonic() >= end:
            return held
        time.sleep(0.01)


def end_failed_restore(pids: Sequence[int], *, wait_s: float = 5.0) -> None:
    """What a failed `criu restore` made of a tree with host pids: CRIU kills it but does not wait for its end,
    so the tree's process group is killed again and waited for until none of its pids runs (zombies are their
    parents' to reap): nothing of it serves when the caller boots normally. A stranger holding one of the
    pids (the restore failed on it) is outside the group and left alone."""
    if not pids:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pids[0], signal.SIGKILL)
    end = time.monotonic() + wait_s
    while any(_running_group(p) == pids[0] for p in pids) and time.monotonic() < end:
        time.sleep(0.01)


def _running_group(pid: int) -> int | None:
    """The process group of `pid` while it runs (None: gone, a zombie, or unreadable)."""
    try:
        return None if gone_or_zombie(pid) else os.getpgid(pid)
    except OSError:
        return None


def _stranger(pid: int, group: int) -> bool:
    """A live process outside the tree's process group (a pid reused since)."""
    return _running_group(pid) not in (None, group)


def clear_images(images: Path, *, keep: tuple[str, ...] = ()) -> None:
    """A discarded snapshot's files (the directory itself is the caller's), but those named in `keep`
    (CRIU's log of the failed dump, which the failure's reason names)."""
    for entry in images.iterdir() if images.is_dir() else ():
        if entry.name in keep:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
