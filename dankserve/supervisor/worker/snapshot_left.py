"""What a daemon killed with -9 during a snapshot's capture or restore left behind (issue 41, docs/snapshots.md),
for the worker's `SnapshotEdge`: a server found running beside an entry without a manifest (a capture midway:
GPU-locked, checkpointed or asleep) is repaired before it is adopted; a Podman container found running beside a
ready entry marked `restoring` (a restore midway) is left to the boot's restore, which takes it over and judges
it by the canary (`finish`), as the process runtime's restore does with the tree CRIU restored unrecorded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from dankserve.errors import DankserveError
from dankserve.host.gpu_processes import inner_pid, process_tree
from dankserve.plan.serve_args import served_name
from dankserve.planning import backend_address
from dankserve.settings import DeploymentSettings, Settings
from dankserve.snapshot import store
from dankserve.snapshot.sequence import canary_problem
from dankserve.snapshot.steps import Hooks, StepFailed
from dankserve.snapshot.suspend import resume_steps
from dankserve.supervisor.worker import podman_snapshots as podman
from dankserve.supervisor.worker.snapshot_hooks import serve_again, server_hooks


def read_key(dep: DeploymentSettings) -> str | None:
    from dankserve.secret_files import read_key_now

    return read_key_now(dep.api_key_file)


def hooks_for(
    edges: Any,
    settings: Settings,
    name: str,
    dep: DeploymentSettings,
    *,
    sleeps: bool,
    prepares: bool,
    after_sleep: Callable[[], None] = lambda: None,
) -> Hooks:
    """The server's sleep (level 2, or 0.34's checkpoint prepare), wake and canary (`snapshot_hooks`)."""
    address = backend_address(settings, name, dep)
    model = served_name(dep.served_model_name, dep.extra_args, dep.model)
    return server_hooks(edges, address, read_key(dep), model, sleeps=sleeps, prepares=prepares, after_sleep=after_sleep)


def gpu_running(gpu: Any, holders: Iterable[int], done: list[str]) -> None:
    """Each CUDA process back to running from wherever a stopped sequence left it: the steps suspended sleep's
    resume decides from each process's driver state (restores before unlocks)."""
    for step in resume_steps({pid: gpu.state(pid) for pid in holders}):
        (gpu.restore if step.name == "gpu_restore" else gpu.unlock)(step.pid)
        done.append(f"GPU {step.name.removeprefix('gpu_')} of pid {step.pid}")


@dataclass(frozen=True)
class LeftBehind:
    """One deployment's view of what a killed daemon left."""

    name: str
    settings: Callable[[], Settings]
    gpu: Callable[[], Any]
    edges: Any
    log: Any

    def restore_left(self, pid: int | None) -> bool:
        """A Podman container found running beside a ready entry marked `restoring`: a restore a daemon killed
        with -9 midway left (restored by Podman, maybe not yet GPU-restored, unlocked, woken). Not adopted as it
        is: the boot's restore takes it over and judges it by the canary (`finish`)."""
        if pid is None:
            return False
        root = store.store_root(self.settings().state_dir)
        with contextlib.suppress(DankserveError, OSError):
            return (
                store.check_root(root)
                and store.read_entry(root, self.name).state == "ready"
                and (root / self.name / podman.RESTORING).is_file()
            )
        return False

    def repair_interrupted(self, dep: DeploymentSettings, pid: int | None, *, restore_left: bool = False) -> None:
        """A server found running beside an entry without a manifest: a capture the daemon did not finish
        (killed with -9 midway) may have left it GPU-locked, checkpointed or asleep. Its CUDA processes are
        restored and unlocked, and it is woken, before it is adopted; the entry goes with the verdict. A restore
        a killed daemon left (`restore_left`) whose snapshot this plan does not restore (changed, off): the same
        repair before the machine adopts or replaces it."""
        root = store.store_root(self.settings().state_dir)
        state = "ready" if restore_left else None
        with contextlib.suppress(DankserveError, OSError):
            if pid is not None and state is None and store.check_root(root):
                state = store.read_entry(root, self.name).state
        if pid is None or state not in ("incomplete", "ready"):
            return
        marker = root / self.name / podman.RESTORING
        if state == "ready" and not (restore_left or marker.is_file()):
            return  # a server serving beside its snapshot
        marker.unlink(missing_ok=True)
        done: list[str] = []
        try:
            gpu = self.gpu()
            gpu_running(gpu, gpu.holders(process_tree(pid)), done)
            woke = serve_again(self.edges, backend_address(self.settings(), self.name, dep), read_key(dep))
            done += [woke] if woke else []
        except (DankserveError, OSError) as exc:
            reason = exc.message if isinstance(exc, DankserveError) else str(exc)
            self.log.warning("snapshot_capture_repair_failed", error=reason, done=done)
            return
        event = "snapshot_restore_resumed" if state == "ready" else "snapshot_capture_interrupted"
        self.log.warning(event, pid=pid, repaired=done or ["nothing to undo"])

    def finish(
        self,
        dep: DeploymentSettings,
        root: int,
        holders: Iterable[int],
        *,
        sleeps: bool,
        prepares: bool,
        ids: tuple[int, ...],
    ) -> tuple[list[str], str | None]:
        """A restored server a stopped daemon left (its root at `root`): the GPU steps its processes' driver
        states need (`holders`: their pids inside its namespace), the wake if it sleeps or is prepared, then the
        canary; what was done, and the problem (None: it answered the captured `ids`)."""
        done: list[str] = []
        settings = self.settings()
        hooks = hooks_for(self.edges, settings, self.name, dep, sleeps=sleeps, prepares=prepares)
        inside = {inner_pid(pid): pid for pid in process_tree(root)}  # a container's holders: its own pids
        try:
            gpu_running(self.gpu(), [inside[h] for h in holders if h in inside], done)
            address, key = backend_address(settings, self.name, dep), read_key(dep)
            asleep = self.edges.checkpoint_prepared if prepares else self.edges.is_sleeping
            if asleep(address, key):
                hooks.wake()
            return done, canary_problem(ids, hooks.canary())
        except (DankserveError, OSError, StepFailed) as exc:
            return done, exc.message if isinstance(exc, DankserveError) else str(exc)
