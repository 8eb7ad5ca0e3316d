"""A worker's snapshot edge (issue 41, docs/snapshots.md): the verdict on the deployment's snapshot while
planning, the capture of its ready server, the restore in a boot's place. What to do when is the machine's
(`machine/snapshots.py`); this runs it against the store, CRIU, the GPU checkpoint and the server's routes.

The process runtime here; a Podman deployment's container through Podman's checkpoint and restore
(`podman_snapshots.py`). The server's tree keeps its pids through a restore: they must be free then, so
the restore waits (bounded) for the killed tree's processes to be gone, and a pid another process took fails the restore
(the normal boot runs). Every failure is a reason, never an exception: the machine discards and boots.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import dankserve
from dankserve.errors import DankserveError
from dankserve.host.gpu_processes import process_tree
from dankserve.host.model import Host
from dankserve.plan.serve_args import served_name
from dankserve.plan.types import Plan
from dankserve.planning import backend_address
from dankserve.runtime.base import Runtime
from dankserve.runtime.podman.runtime import PodmanRuntime
from dankserve.runtime.process import ProcessRecord, ProcessRuntime, record_of
from dankserve.settings import DeploymentSettings, Settings
from dankserve.snapshot import capture as capturing
from dankserve.snapshot import criu, shm, store
from dankserve.snapshot import restore as restoring
from dankserve.snapshot.key import SnapshotKey, WeightsFile, invalid_reason
from dankserve.snapshot.sequence import canary_problem
from dankserve.snapshot.steps import Hooks, StepFailed, kill_tree
from dankserve.supervisor import machine as m
from dankserve.supervisor.fleet.swap_verify import canary_ids
from dankserve.supervisor.worker import podman_snapshots as podman

PIDS_FREE_SECONDS = 10.0
"""How long a restore waits for the killed tree's pids to be free (its processes reaped)."""
_MAX_WEIGHT_FILES = 10_000


@dataclass(frozen=True)
class Captured:
    """What a restore needs of the capture (kept in the manifest): the key, the tree, the canary's ids."""

    key: SnapshotKey
    pids: tuple[int, ...]
    holders: tuple[int, ...]
    canary_ids: tuple[int, ...]
    record: ProcessRecord
    sleeps: bool
    shm: tuple[str, ...]


class SnapshotEdge:
    """One deployment's snapshots."""

    def __init__(
        self,
        name: str,
        *,
        settings: Callable[[], Settings],
        host: Host,
        gpu: Callable[[], Any],
        edges: Any,
        logger: Any,
    ) -> None:
        self._name = name
        self._settings = settings
        self._host = host
        self._gpu_checkpoint = gpu
        self._edges = edges  # sleep_server and wake_server (the world's ServerEdges)
        self._log = logger
        self._key: SnapshotKey | None = None
        self._sleeps = False

    # -- planning -------------------------------------------------------------------------------
    def verdict(
        self, dep: DeploymentSettings, runtime: Runtime, plan: Plan, digest: str | None, version: str | None
    ) -> m.SnapshotPlan:
        """ready (valid for this plan), absent (capture once ready) or off, and why; an invalid snapshot is
        deleted here with its reason (a changed configuration deletes it: it holds the server's secrets)."""
        self._key = None
        if dep.snapshot == "off":  # the one there was holds the server's secrets: deleted
            with contextlib.suppress(DankserveError, OSError):
                if store.remove(store.store_root(self._settings().state_dir), self._name):
                    self._log.info("snapshot_discarded", reason='snapshot = "off"')
            return m.SnapshotPlan("off", 'snapshot = "off"')
        unusable = None if isinstance(runtime, ProcessRuntime) else podman.unsupported(runtime, dep)
        if unusable is not None:
            return m.SnapshotPlan("off", unusable)
        if len(plan.gpu_uuids) != 1 or dep.hosts:
            return m.SnapshotPlan("off", "more than one GPU (TP > 1: NCCL cannot be checkpointed)")
        binary = criu.criu_path()
        if binary is None:
            return m.SnapshotPlan("off", "CRIU is not installed (`make system-deps`); restarts boot normally")
        if os.geteuid() != 0:
            return m.SnapshotPlan("off", "CRIU needs root (the systemd unit runs dankserve as root)")
        settings = self._settings()
        if settings.snapshot_max_bytes == 0:
            return m.SnapshotPlan("off", "snapshot_max_bytes = 0")
        self._key = self._current_key(dep, plan, digest, version, criu.criu_version(binary) or "unknown")
        self._sleeps = plan.sleep_mode
        root = store.store_root(settings.state_dir)
        try:
            if isinstance(runtime, PodmanRuntime):
                podman.write_criu_config(settings.state_dir)  # named by the container it creates
            if not store.check_root(root):
                return m.SnapshotPlan("absent", "none captured yet: the ready server is captured once")
        except DankserveError as exc:
            self._key = None
            return m.SnapshotPlan("off", exc.message)
        entry = store.read_entry(root, self._name)
        if entry.state == "ready":
            stored = stored_key(entry.path)
            why = "its manifest is unreadable" if stored is None else invalid_reason(stored, self._key)
            if why is None:
                return m.SnapshotPlan("ready", "valid for this plan: the next start restores it")
            self._discard(root, why)
            return m.SnapshotPlan("absent", f"the last snapshot was deleted: {why}", discarded=why)
        if (root / self._name).exists() or (root / self._name).is_symlink():
            why = entry.reason or entry.state
            self._discard(root, why)
            return m.SnapshotPlan("absent", f"the last snapshot was deleted: {why}", discarded=why)
        return m.SnapshotPlan("absent", "none captured yet: the ready server is captured once")

    def _current_key(
        self, dep: DeploymentSettings, plan: Plan, digest: str | None, version: str | None, criu_version: str
    ) -> SnapshotKey:
        gpu = next((g for g in self._host.gpus if g.uuid in plan.gpu_uuids), None)
        return SnapshotKey.of(
            argv=tuple(plan.argv),
            env=dict(plan.env),
            image_digest=digest or "",
            vllm_version=version or plan.vllm_version or "",
            driver_version=self._host.driver_version or "",
            gpu_model=gpu.name if gpu is not None else "",
            gpu_uuid=gpu.uuid if gpu is not None else "",
            kernel_release=os.uname().release,
            criu_version=criu_version,
            dankserve_version=dankserve.__version__,
            weights=weights_files(dep, self._settings().hf_cache_dir),
        )

    def repair_interrupted(self, dep: DeploymentSettings, pid: int | None) -> None:
        """A server found running beside an entry without a manifest: a capture the daemon did not finish
        (killed with -9 midway) may have left it GPU-locked, checkpointed or asleep. Its CUDA processes are
        restored and unlocked, and it is woken, before it is adopted; the entry goes with the verdict. Beside
        a ready entry marked `restoring`, a restore a killed daemon left (a Podman container restored, not yet
        GPU-restored and woken): the same repair."""
        root = store.store_root(self._settings().state_dir)
        state = None
        with contextlib.suppress(DankserveError, OSError):
            if pid is not None and store.check_root(root):
                state = store.read_entry(root, self._name).state
        if pid is None or state not in ("incomplete", "ready"):
            return
        marker = root / self._name / podman.RESTORING
        if state == "ready" and not marker.is_file():
            return  # a server serving beside its snapshot
        marker.unlink(missing_ok=True)
        done: list[str] = []
        try:
            gpu = self._gpu()
            self._gpu_running(gpu.holders(process_tree(pid)), done)
            address, key = backend_address(self._settings(), self._name, dep), _read_key(dep)
            if self._edges.is_sleeping(address, key):
                self._edges.wake_server(address, key, "2")
                done.append("wake")
        except (DankserveError, OSError) as exc:
            reason = exc.message if isinstance(exc, DankserveError) else str(exc)
            self._log.warning("snapshot_capture_repair_failed", error=reason, done=done)
            return
        event = "snapshot_restore_resumed" if state == "ready" else "snapshot_capture_interrupted"
        self._log.warning(event, pid=pid, repaired=done or ["nothing to undo"])

    def _gpu_running(self, holders: Iterable[int], done: list[str]) -> None:
        """Each CUDA process back to running from wherever a stopped sequence left it."""
        gpu = self._gpu()
        for holder in holders:
            state = gpu.state(holder)
            if state == "checkpointed":
                gpu.restore(holder)
                done.append(f"GPU restore of pid {holder}")
            if state in ("checkpointed", "locked"):
                gpu.unlock(holder)
                done.append(f"GPU unlock of pid {holder}")

    # -- capture --------------------------------------------------------------------------------
    def capture(self, dep: DeploymentSettings, runtime: Runtime, workload_id: str) -> m.Event:
        """Captures the ready server; a failure is undone (the server serves) and said."""
        try:
            return self._capture(dep, runtime, workload_id)
        except Exception as exc:  # a capture never takes the serving server down: said, and left serving
            if not isinstance(exc, (DankserveError, OSError)):
                self._log.exception("snapshot_capture_error")
            reason = exc.message if isinstance(exc, DankserveError) else f"{type(exc).__name__}: {exc}"
            with contextlib.suppress(DankserveError, OSError):
                store.remove(store.store_root(self._settings().state_dir), self._name)
            return m.SnapshotCaptureFailed(reason)

    def _capture(self, dep: DeploymentSettings, runtime: Runtime, workload_id: str) -> m.Event:
        key = self._key
        record = record_of(runtime, workload_id) if isinstance(runtime, ProcessRuntime) else None
        if key is None or (record is None and not isinstance(runtime, PodmanRuntime)):
            return m.SnapshotCaptureFailed("the server is not one the process runtime started")
        settings = self._settings()
        root = store.store_root(settings.state_dir)
        store.check_root(root, create=True)
        store.remove(root, self._name)
        entry = root / self._name
        entry.mkdir(mode=0o700)
        images = entry / "images"
        images.mkdir(mode=0o700)
        if record is None:  # Podman: its checkpoint and restore (podman_snapshots.py)
            assert isinstance(runtime, PodmanRuntime)
            outcome, kept = podman.capture(runtime, workload_id, images, self._gpu(), self._hooks(dep))
        else:
            pids = tuple(process_tree(record.pid))
            saved: list[str] = []

            def keep_segments() -> None:  # asleep and idle: the segments as the dump finds the memory
                saved[:] = shm.save(shm.segments(pids), entry / "shm")

            hooks = self._hooks(dep, after_sleep=keep_segments)
            outcome = capturing.capture(record.pid, images, self._gpu(), hooks, criu_binary=criu.criu_path())
            kept = {"pids": list(pids), "record": record.to_json(), "shm": saved}
        if not outcome.ok:
            reason = keep_criu_log(root, self._name, outcome.reason or "the capture failed")
            store.remove(root, self._name)
            return m.SnapshotCaptureFailed(reason)
        size = store.read_entry(root, self._name).bytes
        store.evict(root, max_bytes=settings.snapshot_max_bytes, incoming_bytes=0, keep=self._name)
        total = sum(e.bytes for e in store.list_entries(root))
        if total > settings.snapshot_max_bytes:
            store.remove(root, self._name)
            return m.SnapshotCaptureFailed(
                f"the snapshot takes {size} bytes, over snapshot_max_bytes ({settings.snapshot_max_bytes})"
            )
        now = time.time()
        manifest = {
            "captured_at": now,
            "last_used": now,
            "key": _key_json(key),
            "holders": list(outcome.holders),
            "canary_ids": list(outcome.canary_ids),
            "sleeps": self._sleeps,
            **kept,
            "outage_seconds": round(capturing.outage_seconds(outcome), 3),
            "timings": {k: round(v, 4) for k, v in outcome.timings.items()},
        }
        store.write_manifest(root, self._name, manifest)
        return m.SnapshotCaptured(capturing.outage_seconds(outcome), size)

    # -- restore --------------------------------------------------------------------------------
    def restore(self, dep: DeploymentSettings, runtime: Runtime, boot: int) -> m.Event:
        """The snapshot's server back in a boot's place; any failure deletes the snapshot with its reason."""
        began = time.monotonic()
        root = store.store_root(self._settings().state_dir)
        try:
            event = self._restore(dep, runtime, root, boot, began)
        except Exception as exc:  # anything wrong: the normal boot runs
            if not isinstance(exc, (DankserveError, OSError, ValueError)):
                self._log.exception("snapshot_restore_error")
            event = m.RestoreFailed(exc.message if isinstance(exc, DankserveError) else f"{type(exc).__name__}: {exc}")
        if isinstance(event, m.RestoreFailed):
            event = m.RestoreFailed(keep_criu_log(root, self._name, event.reason))
            self._discard(root, event.reason)
        return event

    def _restore(self, dep: DeploymentSettings, runtime: Runtime, root: Path, boot: int, began: float) -> m.Event:
        entry = store.read_entry(root, self._name)
        if isinstance(runtime, PodmanRuntime):
            manifest = podman.read_manifest(entry.path) if entry.state == "ready" else None
            self._sleeps = bool(manifest and manifest.get("sleeps"))
            hooks = self._hooks(dep)
            keys = (stored_key(entry.path), self._key)
            done = podman.restore_entry(
                runtime, self._name, entry, keys=keys, gpu=self._gpu(), hooks=hooks, manifest=manifest
            )
            return done if isinstance(done, m.RestoreFailed) else self._restored(root, done[1], done[0], boot, began)
        captured = read_captured(entry.path) if entry.state == "ready" else None
        if captured is None or self._key is None or not isinstance(runtime, ProcessRuntime):
            return m.RestoreFailed(entry.reason or "the snapshot's manifest is unreadable")
        why = invalid_reason(captured.key, self._key)
        if why is not None:
            return m.RestoreFailed(why)
        if _restored_already(captured):  # a daemon killed during its restore left the tree running
            return self._resume(dep, runtime, captured, boot, began)
        waited = time.monotonic()
        _free_pids(captured.pids)
        waited = time.monotonic() - waited
        shm.put_back(captured.shm, entry.path / "shm")
        self._sleeps = captured.sleeps
        outcome = restoring.restore(
            entry.path / "images",
            self._gpu(),
            self._hooks(dep),
            holders=captured.holders,
            expected_ids=captured.canary_ids,
            criu_binary=criu.criu_path(),
            appended=(runtime.log_path(self._name),),
        )
        if not outcome.ok or outcome.pid is None:
            return m.RestoreFailed(outcome.reason or "the restore failed")
        restored = replace(captured.record, pid=outcome.pid)
        workload = runtime.adopt_restored(restored)
        return self._restored(root, workload.id, outcome, boot, began, pids_wait_seconds=round(waited, 3))

    def _restored(self, root: Path, workload_id: str, outcome: Any, boot: int, began: float, **more: float) -> m.Event:
        seconds = time.monotonic() - began
        timings = {k: round(v, 3) for k, v in outcome.timings.items()}
        self._log.info("snapshot_restored", seconds=round(seconds, 3), **more, **timings)
        with contextlib.suppress(DankserveError, OSError):
            store.record_restore(root, self._name, seconds=round(seconds, 3), now=time.time())
        return m.Restored(workload_id, boot, seconds)

    def _resume(
        self, dep: DeploymentSettings, runtime: ProcessRuntime, captured: Captured, boot: int, began: float
    ) -> m.Event:
        """The tree CRIU restored for a daemon killed before it took it over: adopted, its GPU restore,
        unlock and wake done (what was not), and judged by the canary like any restore."""
        workload = runtime.adopt_restored(replace(captured.record, pid=captured.pids[0]))
        done: list[str] = []
        self._sleeps = captured.sleeps
        hooks = self._hooks(dep)
        try:
            self._gpu_running(captured.holders, done)
            if self._edges.is_sleeping(backend_address(self._settings(), self._name, dep), _read_key(dep)):
                hooks.wake()
            problem = canary_problem(captured.canary_ids, hooks.canary())
        except (DankserveError, OSError, StepFailed) as exc:
            problem = exc.message if isinstance(exc, DankserveError) else str(exc)
        if problem is not None:
            kill_tree(captured.pids[0])
            runtime.remove(workload.id)
            return m.RestoreFailed(f"the restore a stopped daemon left running failed: {problem}")
        self._log.warning("snapshot_restore_resumed", pid=captured.pids[0], done=done)
        return m.Restored(workload.id, boot, time.monotonic() - began)

    # -- shared ---------------------------------------------------------------------------------
    def _gpu(self) -> Any:
        return self._gpu_checkpoint()

    def _hooks(self, dep: DeploymentSettings, after_sleep: Callable[[], None] = lambda: None) -> Hooks:
        address = backend_address(self._settings(), self._name, dep)
        return server_hooks(self._edges, address, dep, sleeps=self._sleeps, after_sleep=after_sleep)

    def _discard(self, root: Path, why: str) -> None:
        why = keep_criu_log(root, self._name, why)
        self._log.warning("snapshot_discarded", reason=why)
        with contextlib.suppress(DankserveError, OSError):
            store.remove(root, self._name)


def _parse_key(key: Any) -> SnapshotKey:
    return SnapshotKey(
        argv=tuple(str(a) for a in key["argv"]),
        env=tuple((str(k), str(v)) for k, v in key["env"]),
        weights=tuple(WeightsFile(str(w[0]), int(w[1]), int(w[2])) for w in key["weights"]),
        **{f: str(key[f]) for f in _KEY_TEXT},
    )


def stored_key(path: Path) -> SnapshotKey | None:
    """The key a snapshot was captured with, whatever its runtime (None: unreadable)."""
    try:
        return _parse_key(json.loads((path / store.MANIFEST).read_bytes()[: 1 << 20])["key"])
    except (OSError, ValueError, KeyError, TypeError, IndexError, RecursionError):
        return None


def server_hooks(
    edges: Any, address: Any, dep: DeploymentSettings, *, sleeps: bool, after_sleep: Callable[[], None]
) -> Hooks:
    """The server's sleep (level 2), wake and greedy canary; without sleep mode the sleep and wake are
    skipped (the GPU checkpoint then copies the weights too: a bigger snapshot)."""
    key = _read_key(dep)
    model = served_name(dep.served_model_name, dep.extra_args, dep.model)

    def sleep() -> None:
        if sleeps:
            answer = edges.sleep_server(address, key, "2")
            if not isinstance(answer, m.FellAsleep):
                raise StepFailed(str(getattr(answer, "message", answer)))
        after_sleep()

    def wake() -> None:
        if sleeps:
            answer = edges.wake_server(address, key, "2")
            if not isinstance(answer, m.WokeUp):
                raise StepFailed(str(getattr(answer, "message", answer)))

    def canary() -> tuple[int, ...]:
        ids = canary_ids(address, key, model)
        if isinstance(ids, str):
            raise StepFailed(ids)
        return ids

    return Hooks(sleep=sleep, wake=wake, canary=canary)


def read_captured(path: Path) -> Captured | None:
    """The manifest's capture, read as hostile input (None: not one of ours)."""
    try:
        data = json.loads((path / store.MANIFEST).read_bytes()[: 1 << 20])
        return Captured(
            key=_parse_key(data["key"]),
            pids=tuple(int(p) for p in data["pids"]),
            holders=tuple(int(p) for p in data["holders"]),
            canary_ids=tuple(int(i) for i in data["canary_ids"]),
            record=ProcessRecord.from_json(data["record"]),
            sleeps=bool(data.get("sleeps", False)),
            shm=tuple(str(n) for n in data.get("shm", ())),
        )
    except (OSError, ValueError, KeyError, TypeError, IndexError, RecursionError):
        return None


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


_KEY_TEXT = (
    "image_digest",
    "vllm_version",
    "driver_version",
    "gpu_model",
    "gpu_uuid",
    "kernel_release",
    "criu_version",
    "dankserve_version",
)


def _key_json(key: SnapshotKey) -> dict[str, Any]:
    return {
        "argv": list(key.argv),
        "env": [list(pair) for pair in key.env],
        "weights": [[w.name, w.size, w.mtime_ns] for w in key.weights],
        **{f: getattr(key, f) for f in _KEY_TEXT},
    }


def _read_key(dep: DeploymentSettings) -> str | None:
    from dankserve.secret_files import read_key_now

    return read_key_now(dep.api_key_file)


def weights_files(dep: DeploymentSettings, hf_cache: Path) -> tuple[WeightsFile, ...]:
    """The model's files as the file system describes them: a local directory, or its HF cache entry
    (none found: no files, so only the rest of the key guards the snapshot). Bounded in count."""
    local = Path(dep.model)
    name = "models--" + dep.model.replace("/", "--")
    candidates = [local] if local.is_absolute() else [hf_cache / "hub" / name, hf_cache / name]
    found: list[WeightsFile] = []
    for base in candidates:
        if not base.is_dir():
            continue
        for dirpath, _dirs, files in os.walk(base):
            for file in files:
                path = Path(dirpath) / file
                with contextlib.suppress(OSError):
                    st = path.stat()  # the cache's snapshot links point at its blobs
                    found.append(WeightsFile(str(path.relative_to(base)), st.st_size, st.st_mtime_ns))
                if len(found) >= _MAX_WEIGHT_FILES:
                    return tuple(found)
        break
    return tuple(found)


def _free_pids(pids: tuple[int, ...]) -> None:
    """Until the captured tree's pids are free (bounded): what is left of the killed tree's group is
    killed (its root gone, the group still names it), zombies are reaped by their parents. A pid still
    taken then fails `criu restore` with its reason."""
    if not pids:
        return
    root = pids[0]
    if _gone_or_zombie(root):  # the group still names the dead root: what is left of its tree
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(root, signal.SIGKILL)
    end = time.monotonic() + PIDS_FREE_SECONDS
    while time.monotonic() < end:
        held = [p for p in pids if Path(f"/proc/{p}").exists()]
        if not held or any(_stranger(p, root) for p in held):
            return  # free, or one taken by another process: no use waiting (the restore says which)
        time.sleep(0.02)


def _stranger(pid: int, group: int) -> bool:
    """A live process outside the killed tree's process group: it will not go away by itself."""
    try:
        return not _gone_or_zombie(pid) and os.getpgid(pid) != group
    except OSError:
        return False


def _gone_or_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def _restored_already(captured: Captured) -> bool:
    """The captured root pid runs the captured command line: the tree is restored already (by a daemon
    killed before it recorded it), not a stranger holding the pid."""
    try:
        cmdline = Path(f"/proc/{captured.pids[0]}/cmdline").read_bytes()
    except (OSError, IndexError):
        return False
    argv = [a.encode() for a in captured.record.argv]
    # A script's interpreter comes first (`#!`): the command line ends with the recorded argv.
    return bool(argv) and cmdline.rstrip(b"\0").split(b"\0")[-len(argv) :] == argv
