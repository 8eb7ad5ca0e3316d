"""A worker's snapshot edge (issue 41, docs/snapshots.md): the verdict on the deployment's snapshot while planning,
the capture of its ready server, the restore in a boot's place. What to do when is the machine's
(`machine/snapshots.py`); this runs it against the store, CRIU, the GPU checkpoint and the server's routes.

The process runtime: its server keeps its host pids (CUDA refuses a PID namespace sharing the host's /proc:
docs/snapshots.md, "Host pids"); CRIU restores the tree with them once they are free. The capture dumps the tree
(it ends) and restores it at once: the restored tree is the deployment's server from then on. A Podman deployment's
container goes through Podman's checkpoint and restore (`podman_snapshots.py`). Every failure is a reason, never an
exception: the machine discards and boots.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import dankserve
from dankserve.errors import DankserveError
from dankserve.host.model import Host
from dankserve.plan.catalogue import capabilities
from dankserve.plan.types import Plan
from dankserve.runtime.base import Runtime, Workload
from dankserve.runtime.podman.runtime import PodmanRuntime
from dankserve.runtime.process import ProcessRecord, ProcessRuntime, record_of
from dankserve.settings import DeploymentSettings, Settings
from dankserve.snapshot import criu, shm, store
from dankserve.snapshot import restore as restoring
from dankserve.snapshot.gpu_helper import unavailable
from dankserve.snapshot.key import SnapshotKey, WeightsFile, invalid_reason, secrets_digest
from dankserve.snapshot.steps import Hooks, Outcome, kill_tree
from dankserve.supervisor import machine as m
from dankserve.supervisor.worker import podman_snapshots as podman
from dankserve.supervisor.worker import snapshot_rollback as rollback
from dankserve.supervisor.worker.deployment_secrets import secret_values
from dankserve.supervisor.worker.snapshot_capture import (
    CaptureJob,
    ContainerJob,
    capture_container,
    capture_tree,
    keep_criu_log,
    remove_entry,
)
from dankserve.supervisor.worker.snapshot_left import LeftBehind, hooks_for

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
    prepares: bool = False
    """Captured through vLLM 0.34's `/checkpoint/prepare`: served again by `/checkpoint/restore`."""
    link_remaps: tuple[str, ...] = ()
    """CRIU's `link_remap.N` files of the dump (the tree's deleted /dev/shm files), put back before a restore."""


LAUNCHER_PROCESS = (
    "launcher = true on the process runtime: its server is the launcher's child, which a restore cannot give "
    'back to it (Podman captures the launcher\'s whole container); set launcher = "auto" to restore restarts'
)


def _unusable(runtime: Runtime, dep: DeploymentSettings) -> str | None:
    """Why this deployment's server cannot be captured on its runtime (None: nothing so far)."""
    if isinstance(runtime, ProcessRuntime):
        return LAUNCHER_PROCESS if dep.uses_launcher else None
    return podman.unsupported(runtime, dep)


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
        self._prepares = False
        self._left = LeftBehind(name, settings, gpu, edges, logger)

    @property
    def on(self) -> bool:
        """The last verdict was `ready` or `absent`: the server's ready boot is captured, a restart restores."""
        return self._key is not None

    # -- planning -------------------------------------------------------------------------------
    def verdict(self, dep: DeploymentSettings, runtime: Runtime, plan: Plan, *more: Any, **kw: Any) -> m.SnapshotPlan:
        found = self._verdict(dep, runtime, plan, *more, **kw)  # Podman's: the whole container, a launcher's too
        return replace(found, whole=True) if isinstance(runtime, PodmanRuntime) and found.state != "off" else found

    def _verdict(
        self,
        dep: DeploymentSettings,
        runtime: Runtime,
        plan: Plan,
        digest: str | None,
        version: str | None,
        *,
        upgrade_switched: bool = False,
    ) -> m.SnapshotPlan:
        """ready (valid for this plan), absent (capture once ready) or off, and why; an invalid snapshot is
        deleted here with its reason (a changed configuration deletes it: it holds the server's secrets), unless
        a switched upgrade can roll back to it (`upgrade_switched`): then it is kept aside (snapshot_rollback)."""
        self._key = None
        if dep.snapshot == "off":  # the one there was holds the server's secrets: deleted
            with contextlib.suppress(DankserveError, OSError):
                root = store.store_root(self._settings().state_dir)
                if store.remove(root, self._name) | store.remove(root, store.previous(self._name)):
                    self._log.info("snapshot_discarded", reason='snapshot = "off"')
            return m.SnapshotPlan("off", 'snapshot = "off"')
        unusable = _unusable(runtime, dep)  # the snapshot is kept: the deployment set back makes it usable
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
        missing = unavailable(self._gpu_checkpoint())  # the snapshot is kept: installing the extra makes it usable
        if missing is not None:
            return m.SnapshotPlan("off", f"{missing.reason}: the GPU checkpoint needs it ({missing.fix})")
        self._key = self._current_key(dep, plan, digest, version, criu.criu_version(binary) or "unknown")
        # Asleep only through dev-mode routes (on TCP, sleep mode serves 0.34's checkpoint routes alone)
        self._sleeps = plan.sleep_mode and plan.exposure is not None and plan.exposure.dev_mode
        self._prepares = prepares_for_checkpoint(plan, version)
        root = store.store_root(settings.state_dir)
        try:
            if isinstance(runtime, PodmanRuntime):
                podman.write_criu_config(settings.state_dir)  # named by the container it creates
            if not store.check_root(root):
                return m.SnapshotPlan("absent", "none captured yet: the ready server is captured once")
        except DankserveError as exc:
            self._key = None
            return m.SnapshotPlan("off", exc.message)
        judge: rollback.Judge = functools.partial(invalid_for, key=self._key)
        taken = rollback.take_back(root, self._name, judge, switched=upgrade_switched, log=self._log)
        entry = store.read_entry(root, self._name)
        if entry.state == "ready":
            stored = stored_key(entry.path)
            why = judge(entry.path)
            if why is None:
                kept = "kept from before the upgrade: this boot restores it" if taken else "the next start restores it"
                return m.SnapshotPlan("ready", f"valid for this plan: {kept}")
            other = stored is not None and stored.image_digest != self._key.image_digest
            if rollback.keep_aside(root, self._name, why, switched=upgrade_switched, other_image=other, log=self._log):
                kept = f"the old image's snapshot is kept as {store.previous(self._name)} for a rollback"
                return m.SnapshotPlan("absent", f"none for this image yet ({kept})")
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
            secrets=secrets_digest(secret_values(dep)),
        )

    def restore_left(self, pid: int | None) -> bool:
        """A Podman restore a daemon killed with -9 left running: the boot's restore takes it over (`snapshot_left`)."""
        return self._left.restore_left(pid)

    def repair_interrupted(self, dep: DeploymentSettings, pid: int | None, *, restore_left: bool = False) -> None:
        """A capture (or a restore not taken over) a killed daemon left midway, repaired (`snapshot_left`)."""
        self._left.repair_interrupted(dep, pid, restore_left=restore_left)

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
                remove_entry(store.store_root(self._settings().state_dir), self._name)
            return m.SnapshotCaptureFailed(reason)

    def _capture(self, dep: DeploymentSettings, runtime: Runtime, workload_id: str) -> m.Event:
        key = self._key
        record = record_of(runtime, workload_id) if isinstance(runtime, ProcessRuntime) else None
        if key is None:
            return m.SnapshotCaptureFailed("no snapshot was planned for this boot")
        settings = self._settings()
        root = store.store_root(settings.state_dir)
        base = {"key": _key_json(key), "sleeps": self._sleeps, "prepares": self._prepares}
        if isinstance(runtime, PodmanRuntime):  # its checkpoint and restore (podman_snapshots.py)
            job = ContainerJob(self._name, root, runtime, workload_id, settings.snapshot_max_bytes)
            return capture_container(job, base, self._gpu_checkpoint(), self._hooks(dep))
        if record is None or not isinstance(runtime, ProcessRuntime):
            return m.SnapshotCaptureFailed("the server is not one the process runtime started")
        return capture_tree(
            CaptureJob(self._name, root, record, runtime, settings.snapshot_max_bytes),
            base,
            self._gpu_checkpoint(),
            lambda keep: self._hooks(dep, after_sleep=keep),
            self._log,
        )

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
            self._prepares = bool(manifest and manifest.get("prepares") is True)
            left = podman.left_restored(runtime, self._name, entry)
            if left is not None and manifest is not None:  # a daemon killed during its restore left it running
                return self._resume_container(dep, runtime, left, manifest, root=root, boot=boot, began=began)
            files = podman.secrets_of(dep, self._name, self._settings().state_dir)
            gpu, keys = self._gpu_checkpoint(), (stored_key(entry.path), self._key)
            done = podman.restore_entry(
                runtime, self._name, entry, keys=keys, gpu=gpu, hooks=self._hooks(dep), manifest=manifest, secrets=files
            )
            return done if isinstance(done, m.RestoreFailed) else self._restored(root, done[1], done[0], boot, began)
        captured = read_captured(entry.path) if entry.state == "ready" else None
        if captured is None or self._key is None or not isinstance(runtime, ProcessRuntime):
            return m.RestoreFailed(entry.reason or "the snapshot's manifest is unreadable")
        why = invalid_reason(captured.key, self._key)
        if why is not None:
            return m.RestoreFailed(why)
        tree = _restored_already(captured, entry.path / "images")
        if tree is not None:  # a daemon killed during its restore left the tree running
            return self._resume(dep, runtime, captured, root=tree, boot=boot, began=began)
        self._sleeps, self._prepares = captured.sleeps, captured.prepares
        with shm.turn():  # one dump or restore at a time on the host: their link-remap files share /dev/shm
            put = shm.put_back((*captured.shm, *captured.link_remaps), entry.path / "shm")
            try:
                outcome = restoring.restore(
                    entry.path / "images",
                    self._gpu_checkpoint(),
                    self._hooks(dep),
                    holders=captured.holders,
                    expected_ids=captured.canary_ids,
                    criu_binary=criu.criu_path(),
                    appended=(runtime.log_path(self._name),),
                    pids=captured.pids,
                )
            finally:
                shm.clear_remaps(put)
        if not outcome.ok or outcome.pid is None:
            return m.RestoreFailed(outcome.reason or "the restore failed")
        restored = replace(captured.record, pid=outcome.pid)
        workload = runtime.adopt_restored(restored)
        return self._restored(root, workload.id, outcome, boot, began, pid=outcome.pid)

    def _restored(
        self,
        root: Path,
        workload_id: str,
        outcome: Any,
        boot: int,
        began: float,
        *,
        resumed: bool = False,
        **more: float,
    ) -> m.Event:
        seconds = time.monotonic() - began
        timings = {k: round(v, 3) for k, v in outcome.timings.items()}
        self._log.info("snapshot_restored", seconds=round(seconds, 3), **more, **timings)
        with contextlib.suppress(DankserveError, OSError):
            store.record_restore(root, self._name, seconds=round(seconds, 3), now=time.time())
        return m.Restored(workload_id, boot, seconds, resumed=resumed)

    def _resume(
        self,
        dep: DeploymentSettings,
        runtime: ProcessRuntime,
        captured: Captured,
        *,
        root: int,
        boot: int,
        began: float,
    ) -> m.Event:
        """The tree CRIU restored for a daemon killed before it took it over (its root at `root`): adopted,
        its GPU restore, unlock and wake done (what was not), and judged by the canary like any restore."""
        workload = runtime.adopt_restored(replace(captured.record, pid=root))
        done, problem = self._left.finish(
            dep, root, captured.holders, sleeps=captured.sleeps, prepares=captured.prepares, ids=captured.canary_ids
        )
        if problem is not None:
            kill_tree(root)
            runtime.remove(workload.id)
            return m.RestoreFailed(f"the restore a stopped daemon left running failed: {problem}")
        self._log.warning("snapshot_restore_resumed", pid=root, done=done, canary="the captured ids")
        return m.Restored(workload.id, boot, time.monotonic() - began, resumed=True)

    def _resume_container(
        self, dep: DeploymentSettings, runtime: PodmanRuntime, left: Workload, manifest: dict[str, Any], **at: Any
    ) -> m.Event:
        """Podman's container a killed daemon's restore left running, finished and judged by the canary
        (`snapshot_left`); a problem (or the snapshot invalid for this plan) removes it. `at`: root, boot, began."""
        done: list[str] = []
        root, why = at["root"], invalid_for(at["root"] / self._name, self._key)
        if why is None and left.pid is not None:
            holders = tuple(int(p) for p in manifest["holders"])
            ids = tuple(int(i) for i in manifest["canary_ids"])
            done, why = self._left.finish(dep, left.pid, holders, sleeps=self._sleeps, prepares=self._prepares, ids=ids)
        (root / self._name / podman.RESTORING).unlink(missing_ok=True)
        if why is not None:
            runtime.remove(left.id)
            return m.RestoreFailed(f"the restore a stopped daemon left running failed: {why}")
        self._log.warning("snapshot_restore_resumed", container_id=left.id, done=done, canary="the captured ids")
        return self._restored(root, left.id, Outcome("restore", left.pid), at["boot"], at["began"], resumed=True)

    # -- shared ---------------------------------------------------------------------------------
    def _hooks(self, dep: DeploymentSettings, after_sleep: Callable[[], None] = lambda: None) -> Hooks:
        """The server's sleep (level 2, or 0.34's checkpoint prepare), wake and canary (`snapshot_hooks`)."""
        settings = self._settings()
        sleeps, prepares = self._sleeps, self._prepares
        return hooks_for(
            self._edges, settings, self._name, dep, sleeps=sleeps, prepares=prepares, after_sleep=after_sleep
        )

    def _discard(self, root: Path, why: str) -> None:
        why = keep_criu_log(root, self._name, why)
        self._log.warning("snapshot_discarded", reason=why)
        with contextlib.suppress(DankserveError, OSError):
            remove_entry(root, self._name)


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
            prepares=data.get("prepares") is True,
            link_remaps=tuple(str(n) for n in data.get("link_remaps", ()) if shm.is_link_remap(str(n))),
        )
    except (OSError, ValueError, KeyError, TypeError, IndexError, RecursionError):
        return None


def invalid_for(path: Path, key: SnapshotKey | None) -> str | None:
    """Why the entry at `path` is not valid for the plan whose key is `key` (None: it is)."""
    stored = stored_key(path)
    if stored is None or key is None:
        return "its manifest is unreadable"
    return invalid_reason(stored, key)


_KEY_TEXT = (
    "secrets",
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


def prepares_for_checkpoint(plan: Plan, version: str | None) -> bool:
    """The capture prepares the server through vLLM 0.34's checkpoint routes (served with sleep mode) instead
    of sleeping it at level 2: the release has them and the plan enables sleep mode."""
    return plan.sleep_mode and capabilities(version or plan.vllm_version).checkpoint_routes


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


def _restored_already(captured: Captured, images: Path) -> int | None:
    """The root of a tree CRIU restored from these images that nothing recorded (a daemon killed during the
    restore): the pid in CRIU's pidfile, running the captured command line (not a stranger reusing it)."""
    try:
        pid = int((images / "restore.pid").read_bytes()[:32].decode("ascii", errors="replace").strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    argv = [a.encode() for a in captured.record.argv]
    # A script's interpreter comes first (`#!`): the command line ends with the recorded argv.
    return pid if argv and cmdline.rstrip(b"\0").split(b"\0")[-len(argv) :] == argv else None
