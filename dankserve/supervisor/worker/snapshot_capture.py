"""The capture of a deployment's ready server (issue 41, docs/snapshots.md), for the worker's `SnapshotEdge`:
the dump ends the server's tree and it is restored at once from the image, which proves the snapshot; the
restored tree is adopted as the deployment's server. Around `snapshot.capture`: the store's entry, the files
the image refers to by path (the /dev/shm segments, CRIU's link-remap files), the manifest, the disk budget.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dankserve.host.gpu_processes import process_tree
from dankserve.runtime.podman.runtime import PodmanRuntime
from dankserve.runtime.process import ProcessRecord, ProcessRuntime
from dankserve.snapshot import capture as capturing
from dankserve.snapshot import criu, shm, store
from dankserve.snapshot.steps import Hooks, kill_tree
from dankserve.supervisor import machine as m
from dankserve.supervisor.worker import podman_snapshots as podman


@dataclass(frozen=True)
class CaptureJob:
    """Whose server, where its snapshot goes, the disk budget."""

    name: str
    root: Path
    record: ProcessRecord
    runtime: ProcessRuntime
    max_bytes: int


def capture_tree(
    job: CaptureJob, manifest: dict[str, Any], gpu: Any, hooks_for: Callable[[Callable[[], None]], Hooks], log: Any
) -> m.Event:
    """Captures and restores the server; SnapshotCaptured with the restored workload, or why not (and whether
    the server was lost: its tree ended at the dump and the restore failed)."""
    name, root, record, runtime = job.name, job.root, job.record, job.runtime
    entry = _new_entry(root, name)
    pids = tuple(process_tree(record.pid))
    deleted = shm.deleted_inodes(pids)
    manifest.update(pids=list(pids), record=record.to_json(), shm=[], link_remaps=[])
    put: dict[str, int] = {}

    def keep_segments() -> None:  # asleep and idle: the segments as the dump finds the memory
        manifest["shm"] = list(shm.save(shm.segments(pids), entry / "shm"))

    def keep_files(canary_ids: tuple[int, ...], holders: tuple[int, ...]) -> None:
        """The tree ended at the dump: CRIU's link-remap files kept beside the segments (the restore consumes
        them), both put back, and the manifest written before the restore (a daemon killed during it finds
        the restored tree as after any restore)."""
        manifest["link_remaps"] = list(shm.save(shm.link_remaps(deleted), entry / "shm"))
        put.update(shm.put_back((*manifest["shm"], *manifest["link_remaps"]), entry / "shm"))
        now = time.time()
        manifest.update(captured_at=now, last_used=now, holders=list(holders), canary_ids=list(canary_ids))
        store.write_manifest(root, name, manifest)
        shm.dump_noted(entry)

    with shm.turn():  # one dump or restore at a time on the host: their link-remap files share /dev/shm
        shm.note_dump(entry, deleted)  # a daemon killed before the manifest: the next one deletes the files
        try:
            outcome = capturing.capture(
                record.pid,
                entry / "images",
                gpu,
                hooks_for(keep_segments),
                after_dump=keep_files,
                criu_binary=criu.criu_path(),
                appended=(runtime.log_path(name),),
                max_bytes=job.max_bytes,
            )
        finally:
            shm.clear_remaps(put)
    if not outcome.ok or outcome.pid is None:
        reason = keep_criu_log(root, name, outcome.reason or "the capture failed")
        remove_entry(root, name)
        served = None  # a tree restored from an image that is not kept (capture.py: a client's connection)
        if not outcome.server_lost and outcome.pid is not None and "criu_restore" in outcome.timings:
            with contextlib.suppress(OSError):  # restored with its own pids: recorded anew (a new start time)
                served = runtime.adopt_restored(replace(record, pid=outcome.pid)).id
            if served is None:
                kill_tree(outcome.pid)
                return m.SnapshotCaptureFailed(reason, server_lost=True)
        again = passing(outcome)
        big = too_big(outcome)
        return m.SnapshotCaptureFailed(
            reason, server_lost=outcome.server_lost, workload_id=served, retry_in=again, too_big=big
        )
    try:
        workload = runtime.adopt_restored(replace(record, pid=outcome.pid)).id
    except OSError as exc:  # unrecorded, it could never be stopped: ended, and a normal boot runs
        kill_tree(outcome.pid)
        remove_entry(root, name)
        return m.SnapshotCaptureFailed(f"the restored server could not be recorded: {exc}", server_lost=True)
    outage = capturing.outage_seconds(outcome)
    timings = {k: round(v, 4) for k, v in outcome.timings.items()}
    log.info("snapshot_capture_restored", pid=outcome.pid, **timings)
    size, why = _within_budget(root, name, job.max_bytes)
    if why is not None:
        return m.SnapshotCaptureFailed(why, workload_id=workload)
    manifest.update(outage_seconds=round(outage, 3), timings=timings)
    store.write_manifest(root, name, manifest)
    return m.SnapshotCaptured(outage, size, workload_id=workload)


@dataclass(frozen=True)
class ContainerJob:
    """A Podman deployment's container, where its snapshot goes, the disk budget."""

    name: str
    root: Path
    runtime: PodmanRuntime
    workload_id: str
    max_bytes: int


def capture_container(job: ContainerJob, manifest: dict[str, Any], gpu: Any, hooks: Hooks) -> m.Event:
    """Podman: the container checkpointed with export and restored in place at once (podman_snapshots.py;
    the same container serves on); SnapshotCaptured, or why not."""
    name, root = job.name, job.root
    entry = _new_entry(root, name)
    outcome, kept = podman.capture(job.runtime, job.workload_id, entry / "images", gpu, hooks, max_bytes=job.max_bytes)
    if not outcome.ok:
        reason = keep_criu_log(root, name, outcome.reason or "the capture failed")
        store.remove(root, name)
        left = job.runtime.inspect(job.workload_id)  # stopped by the checkpoint, not restored: a normal boot
        lost = left is None or not left.running
        again = None if lost else passing(outcome)
        # Serving (never stopped, or restored in place): its log followed anew, as after a capture.
        served = None if lost else job.workload_id
        return m.SnapshotCaptureFailed(
            reason, server_lost=lost, workload_id=served, retry_in=again, too_big=too_big(outcome)
        )
    size, why = _within_budget(root, name, job.max_bytes)
    if why is not None:
        return m.SnapshotCaptureFailed(why, workload_id=job.workload_id)
    now, outage = time.time(), capturing.outage_seconds(outcome)
    manifest.update(
        kept,
        captured_at=now,
        last_used=now,
        holders=list(outcome.holders),
        canary_ids=list(outcome.canary_ids),
        outage_seconds=round(outage, 3),
        timings={k: round(v, 4) for k, v in outcome.timings.items()},
    )
    store.write_manifest(root, name, manifest)
    # The container stopped at the checkpoint and was restored in place (its id kept): its log followed anew.
    return m.SnapshotCaptured(outage, size, workload_id=job.workload_id)


RETRY_SECONDS = 30.0
"""A capture that met clients' connections is tried again this much later (machine/snapshots.py bounds it)."""


def too_big(outcome: Any) -> bool:
    """The capture refused its image as too big (`room`, snapshot/room.py): the same at every boot."""
    failure = outcome.failure
    return failure is not None and failure.step.name == "room"


def passing(outcome: Any) -> float | None:
    """When a failed capture may be tried again: its clients' connections (the `quiet` step, or one caught in
    the image after the restore: snapshot/tcp.py) pass; any other failure waits for the next boot."""
    failure = outcome.failure
    return RETRY_SECONDS if failure is not None and failure.step.name == "quiet" else None


def remove_entry(root: Path, name: str) -> bool:
    """Deletes a deployment's entry; one a killed daemon left between its dump and its manifest takes the
    link-remap files that dump made in /dev/shm with it (shm.py)."""
    if store.check_root(root) and (root / name / shm.DUMP_NOTE).is_file() and not (root / name).is_symlink():
        with shm.turn():
            shm.clear_left_dump(root / name)
    return store.remove(root, name)


def _new_entry(root: Path, name: str) -> Path:
    """The deployment's entry, empty but for its `images` directory (any earlier one deleted)."""
    store.check_root(root, create=True)
    remove_entry(root, name)
    entry = root / name
    entry.mkdir(mode=0o700)
    (entry / "images").mkdir(mode=0o700)
    return entry


def _within_budget(root: Path, name: str, max_bytes: int) -> tuple[int, str | None]:
    """The new snapshot's bytes, others evicted to make room; why it does not fit (then deleted)."""
    size = store.read_entry(root, name).bytes
    store.evict(root, max_bytes=max_bytes, incoming_bytes=0, keep=name)
    if sum(e.bytes for e in store.list_entries(root)) > max_bytes:
        store.remove(root, name)
        return size, f"the snapshot takes {size} bytes, over snapshot_max_bytes ({max_bytes})"
    return size, None


def keep_criu_log(root: Path, name: str, reason: str) -> str:
    """CRIU's log of a failed dump or restore, kept beside the store (`.NAME.criu.log`, 0600) as the entry
    it was in is deleted: the reason names the kept copy."""
    for log in ("dump.log", "restore.log"):
        source = root / name / "images" / log
        if f"(log: {source})" not in reason:
            continue
        kept = root / f".{name}.criu.log"
        with contextlib.suppress(OSError):
            kept.unlink(missing_ok=True)
            fd = os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(source.read_bytes()[-(1 << 20) :])
            return reason.replace(f"(log: {source})", f"(log: {kept})")
    return reason
