"""Snapshots of a Podman deployment's container (issue 41, docs/snapshots.md "Podman"): the capture and the
restore sequences (snapshot/sequence.py) run through Podman's checkpoint and restore (runtime/podman/
checkpoint.py) instead of CRIU on a process tree. `SnapshotEdge` (snapshots.py) dispatches here.

Capture: the reference canary, sleep, GPU lock + checkpoint of the container's CUDA processes, Podman's
checkpoint with export WITHOUT leaving it running (the container stops; CRIU's link-remap files stay in its
/dev/shm, which the archive keeps), restore in place at once (from the container's own images), GPU restore
+ unlock, wake, canary. With `leaveRunning` CRIU deletes its link-remap files after the dump, so the
archive lacks them and a later restore fails ("Can't link dev/shm/link_remap.N -> ...": the H200 lesson 5,
reproduced with Podman 4.3.1 here). Restore: Podman's restore with import of the archive, as the
deployment's container (its name, ports and mounts from the archive's config), GPU restore + unlock, wake,
canary; a failure removes the restored container.

The container's processes get new host pids at every restore (a new pid namespace): the GPU steps name a
process by its pid inside the container, found again on the host through its NSpid.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dankserve.errors import DankserveError
from dankserve.host.gpu_processes import inner_pid, process_tree
from dankserve.plan.shm import SHARED_REASON, shares_host_ipc
from dankserve.runtime.base import SecretFile, Workload
from dankserve.runtime.podman import secret_mounts
from dankserve.runtime.podman.checkpoint import CRIU_CONFIG, PodmanCheckpointFailed, shared_shm
from dankserve.runtime.podman.runtime import PodmanRuntime
from dankserve.settings import DeploymentSettings
from dankserve.snapshot import store
from dankserve.snapshot.gpu import GpuCheckpoint
from dankserve.snapshot.key import SnapshotKey, invalid_reason
from dankserve.snapshot.sequence import Failure, Step, capture_steps, restore_steps
from dankserve.snapshot.steps import Hooks, Outcome, Runner, StepFailed, clear_images
from dankserve.supervisor import machine as m
from dankserve.supervisor.worker.deployment_secrets import secret_files

ARCHIVE = "checkpoint.tar"
"""Podman's exported archive, in the entry's images/."""
RESTORING = "restoring"
"""Beside the images while a restore runs: a daemon killed meanwhile leaves it, and the next one knows that the
container it finds was restored and not yet GPU-restored and woken (not, say, a swap member suspended)."""
_GPU_STEPS = ("gpu_lock", "gpu_checkpoint", "gpu_restore", "gpu_unlock")
_CRIU_CONFIG_FILE = ".podman-criu.conf"


def criu_config_path(state_dir: Path) -> Path:
    """The CRIU configuration a snapshotted container's annotation names (in the store: root's, 0700)."""
    return store.store_root(state_dir) / _CRIU_CONFIG_FILE


def secrets_dir(state_dir: Path, deployment: str) -> Path:
    """Where a snapshot deployment's container finds its secret files (runtime/podman/secret_mounts.py): a path
    that outlives the container, so a restore with import mounts them from where the archive names them."""
    return state_dir / "secrets" / deployment


def write_criu_config(state_dir: Path) -> None:
    """The configuration written (before the container is created: runc reads it at each checkpoint)."""
    root = store.store_root(state_dir)
    store.check_root(root, create=True)
    path = criu_config_path(state_dir)
    with contextlib.suppress(OSError):
        if path.read_text() == CRIU_CONFIG:
            return
    temp = path.with_name(path.name + ".tmp")
    temp.unlink(missing_ok=True)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(CRIU_CONFIG)
    os.replace(temp, path)


def unsupported(runtime: Any, dep: DeploymentSettings) -> str | None:
    """Why a Podman deployment cannot be snapshotted here (None: it can); checked while planning."""
    if not isinstance(runtime, PodmanRuntime):
        return "this runtime has no checkpoint: the process and Podman runtimes only"
    if shares_host_ipc(dep):
        return SHARED_REASON
    return None


def secrets_of(dep: DeploymentSettings, deployment: str, state_dir: Path) -> tuple[Path, tuple[SecretFile, ...]] | None:
    """The secret files a restore writes before it imports the archive (None: the deployment has none): where
    its container mounts them from, and the deployment's files they are read from."""
    files = secret_files(dep)
    return (secrets_dir(state_dir, deployment), files) if files else None


@dataclass
class PodmanRunner(Runner):
    """`Runner` whose dump and restore are Podman's, and whose GPU steps name processes by their pid inside
    the container (found again after each restore)."""

    runtime: PodmanRuntime | None = None
    container: str = ""
    """The container's id (a restore makes a new one)."""
    deployment: str = ""
    in_place: bool = True
    """The restore step restores the container checkpointed by this capture (else: imports the archive)."""

    def _do(self, step: Step) -> None:
        runtime = self.runtime
        assert runtime is not None
        if step.name in _GPU_STEPS and step.pid is not None:
            step = Step(step.name, self._host_pid(step.pid))
        match step.name:
            case "criu_dump":
                self._checkpoint(runtime)
            case "criu_restore":
                try:
                    if self.in_place:
                        restored = runtime.restore_in_place(self.container)
                    else:
                        restored = runtime.restore_import(self.images / ARCHIVE, self.deployment)
                except PodmanCheckpointFailed as exc:
                    reason = _with_log(exc, self.images, "restore.log")
                    left = None if self.in_place else runtime.find(self.deployment)
                    if left is not None:  # a failed import leaves the container it created: the boot needs the name
                        runtime.remove(left.id)
                    raise StepFailed(reason) from exc
                self.container, self.outcome.pid = restored.id, restored.pid
            case "kill_tree":
                runtime.remove(self.container)
            case _:
                super()._do(step)

    def _checkpoint(self, runtime: PodmanRuntime) -> None:
        """Podman's checkpoint with export; the container stops. A failure to write the archive (disk full)
        comes after Podman's checkpoint: the container is restored in place before the step fails."""
        try:
            runtime.checkpoint(self.container, self.images / ARCHIVE)
        except OSError as exc:
            attrs: dict[str, Any] = runtime.container_attrs(self.container) or {}
            if (attrs.get("State") or {}).get("Checkpointed"):
                restored = runtime.restore_in_place(self.container)
                self.container, self.outcome.pid = restored.id, restored.pid
            raise StepFailed(f"writing Podman's checkpoint archive failed: {exc}") from exc
        except PodmanCheckpointFailed as exc:
            raise StepFailed(_with_log(exc, self.images, "dump.log")) from exc

    def _host_pid(self, inside: int) -> int:
        """The host pid of the container's process whose pid inside the container is `inside`."""
        root = self.outcome.pid
        for pid in process_tree(root) if root is not None else ():
            if inner_pid(pid) == inside:
                return pid
        raise StepFailed(f"no process with pid {inside} in the container")


def _with_log(exc: PodmanCheckpointFailed, images: Path, name: str) -> str:
    """The reason, CRIU's log copied beside the images (Podman's copy goes with the container) and named
    as snapshots.py's `keep_criu_log` keeps it."""
    if exc.log is None:
        return exc.message
    kept = images / name
    with contextlib.suppress(OSError):
        kept.write_bytes(exc.log.read_bytes()[-(1 << 20) :])
        return f"{exc.message} (log: {kept})"
    return exc.message


def inner_holders(workload: Workload, gpu: GpuCheckpoint) -> tuple[int, ...]:
    """The container's CUDA processes, by their pid inside it."""
    found = [inner_pid(pid) for pid in gpu.holders(process_tree(workload.pid))]
    return tuple(p for p in found if p is not None)


def capture(
    runtime: PodmanRuntime, workload_id: str, images: Path, gpu: GpuCheckpoint, hooks: Hooks, *, max_bytes: int | None
) -> tuple[Outcome, dict[str, Any]]:
    """The container captured into `images` (its archive); the outcome and the manifest's Podman part."""
    workload = runtime.inspect(workload_id)
    if workload is None or not workload.running or workload.pid is None:
        raise PodmanCheckpointFailed("the container is not running")
    if shared_shm(runtime.container_attrs(workload_id) or {}, workload.pid):
        raise PodmanCheckpointFailed(
            "the container shares the host's /dev/shm (ipc=host: started by an older dankserve)"
        )
    holders = inner_holders(workload, gpu)
    outcome = Outcome("capture", workload.pid, holders=holders)
    runner = PodmanRunner(
        "capture", gpu, hooks, images, outcome, runtime=runtime, container=workload.id, room_budget_bytes=max_bytes
    )
    runner.run((*capture_steps(holders), *restore_steps(holders)))  # the dump restored at once, in place
    if not outcome.ok:
        clear_images(images, keep=("dump.log",))
    return outcome, {"runtime": "podman", "container": runner.container, "archive": ARCHIVE}


def restore_entry(
    runtime: PodmanRuntime,
    deployment: str,
    entry: store.Entry,
    *,
    keys: tuple[SnapshotKey | None, SnapshotKey | None],
    gpu: GpuCheckpoint,
    hooks: Hooks,
    manifest: dict[str, Any] | None,
    secrets: tuple[Path, tuple[SecretFile, ...]] | None = None,
) -> m.RestoreFailed | tuple[Outcome, str]:
    """A ready entry restored (the outcome and the container's id) when its key (`keys`: the stored one and
    the current one) is valid, or why not. `secrets`: the secret files the container mounts (`secrets_of`),
    written again first where the archive names them (the key holds their digest: the same as at capture)."""
    stored, key = keys
    if manifest is None or stored is None or key is None:
        return m.RestoreFailed(entry.reason or "the snapshot's manifest is unreadable")
    why = invalid_reason(stored, key)
    if why is not None:
        return m.RestoreFailed(why)
    outcome, container = restore(
        runtime, deployment, entry.path / "images", gpu, hooks, manifest=manifest, secrets=secrets
    )
    return (outcome, container) if outcome.ok else m.RestoreFailed(outcome.reason or "the restore failed")


def restore(
    runtime: PodmanRuntime,
    deployment: str,
    images: Path,
    gpu: GpuCheckpoint,
    hooks: Hooks,
    *,
    manifest: dict[str, Any],
    secrets: tuple[Path, tuple[SecretFile, ...]] | None = None,
) -> tuple[Outcome, str]:
    """The deployment's container restored from the archive; the outcome and the new container's id. The
    deployment's container the restart left (exited) is removed first: the archive's takes its name."""
    holders = tuple(int(p) for p in manifest["holders"])
    expected = tuple(int(i) for i in manifest["canary_ids"])
    left = runtime.find(deployment)
    if left is not None:
        runtime.remove(left.id)  # its secret files with it: written again below
    outcome = Outcome("restore", None, holders=holders)
    if secrets is not None:  # where the archive's config mounts them from (secret_mounts.py)
        try:
            secret_mounts.write(*secrets)
        except (DankserveError, OSError) as exc:
            said = exc.message if isinstance(exc, DankserveError) else str(exc)
            outcome.failure = Failure(
                "restore", Step("criu_restore"), f"the secret files could not be written: {said}", ()
            )
            return outcome, ""
    marker = images.parent / RESTORING
    marker.touch(mode=0o600)
    runner = PodmanRunner(
        "restore", gpu, hooks, images, outcome, expected_ids=expected, runtime=runtime, deployment=deployment
    )
    runner.in_place = False
    try:
        runner.run(restore_steps(holders))
    finally:
        marker.unlink(missing_ok=True)
    return outcome, runner.container


def left_restored(runtime: PodmanRuntime, deployment: str, entry: store.Entry) -> Workload | None:
    """The deployment's container a daemon killed during its restore left running (the entry still marked
    `restoring`), or None."""
    if entry.state != "ready" or not (entry.path / RESTORING).is_file():
        return None
    found = runtime.find(deployment)
    return found if found is not None and found.running and found.pid is not None else None


def read_manifest(path: Path) -> dict[str, Any] | None:
    """A Podman entry's manifest (None: not a Podman capture, or unreadable), read as hostile input."""
    try:
        data = json.loads((path / store.MANIFEST).read_bytes()[: 1 << 20])
        if not isinstance(data, dict) or data.get("runtime") != "podman":
            return None
        [int(p) for p in data["holders"]]
        [int(i) for i in data["canary_ids"]]
        return data
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
