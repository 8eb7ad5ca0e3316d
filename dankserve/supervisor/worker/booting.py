"""A worker's boot commands: the weights, the plan (and the workload already there), the GPUs' boot slot,
free memory for learning, and the start of a workload or of a launcher's server.

The boot slot is held from `AcquireGpus` until the boot is ready or over (`release`); while a boot
waits for it (or for its swap group's room), `waiting_for` says for what.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from dankserve.errors import DankserveError
from dankserve.host.gpu_memory import wait_dead_processes_released
from dankserve.host.model import Gpu, GpuIdentity, Host
from dankserve.planning import backend_address, compile_cache_dir
from dankserve.runtime.base import Runtime, Workload
from dankserve.secret_files import read_key_now
from dankserve.settings import DeploymentSettings
from dankserve.supervisor import learning
from dankserve.supervisor import machine as m
from dankserve.supervisor.fleet.gpu_slots import BootSlot
from dankserve.supervisor.fleet.swap_roster import PlanFacts
from dankserve.supervisor.machine import BootOverrides
from dankserve.supervisor.worker import launching
from dankserve.supervisor.worker.services import WorkerServices
from dankserve.supervisor.worker.snapshots import SnapshotEdge
from dankserve.supervisor.worker.workload import launcher_run_dir, workload_spec
from dankserve.supervisor.worker.workloads import WorkloadRuntimes


def api_key(dep: DeploymentSettings) -> str | None:
    """The server's API key (sent to its sleep-mode routes too); None without one or when unreadable."""
    return read_key_now(dep.api_key_file)


class Boots:
    """Runs one deployment's boot commands."""

    def __init__(
        self,
        name: str,
        services: WorkerServices,
        runtimes: WorkloadRuntimes,
        *,
        machine: Callable[[], m.MachineState],
        stopping: threading.Event,
        keep_launcher: Callable[[], bool],
        logger: Any,
    ) -> None:
        self._keep_launcher = keep_launcher  # read when a wait ends: a `down` meanwhile keeps the launcher
        self._name = name
        self._services = services
        self._runtimes = runtimes
        self._machine = machine
        self._stopping = stopping
        self._log = logger
        self._slot: BootSlot | None = None
        self._waiting: str | None = None
        self.handover: str | None = None
        """A running workload the next plan adopts (an upgrade's trial server), once."""
        self.max_num_seqs: int | None = None
        """The last plan's --max-num-seqs: the gateway's default cap of requests in flight to it."""
        self._lock = threading.Lock()
        self.snapshots: SnapshotEdge | None = None
        """The deployment's snapshots (issue 41): their verdict is part of the plan."""

    @property
    def waiting_for(self) -> str | None:
        """What the current boot waits for before it may take its GPUs (None: it does not wait)."""
        with self._lock:
            return self._waiting

    def _waits_for(self, why: str | None) -> None:
        with self._lock:
            self._waiting = why

    def fetch_weights(self, dep: DeploymentSettings, progress: Callable[[int], None]) -> m.Event:
        fetch = self._services.world.fetch_weights
        if fetch is not None:
            # Progress is stepped at once (it only updates the percentage); the answer ends the command.
            failed = fetch(self._name, dep, progress)
            if failed is not None:
                return failed
        return m.WeightsReady()

    def acquire_gpus(self, uuids: tuple[str, ...]) -> m.Event:
        """The GPUs' boot slot, once a swap group member's boot has room (StopRequested when stopped meanwhile)."""
        self.release()
        services = self._services
        try:
            if not services.swaps.admit_boot(self._name, uuids, self._stopping, self._waits_for):
                return m.StopRequested(keep_launcher=self._keep_launcher())
            gpu_index = services.gpus.index_of()

            def slot_waits(uuid: str, other: str) -> None:
                self._waits_for(f"GPU {gpu_index.get(uuid, uuid)} boots one deployment at a time: {other} boots there")

            slot = services.gpus.slots.acquire(uuids, self._stopping, holder=self._name, waits=slot_waits)
        finally:
            self._waits_for(None)
        if slot is None:
            return m.StopRequested(keep_launcher=self._keep_launcher())
        self._slot = slot
        return m.GpusAcquired()

    def release(self) -> None:
        if self._slot is not None:
            self._slot.release()
            self._slot = None

    def read_free_memory(self, uuids: tuple[str, ...], settle_first: bool, dep: DeploymentSettings) -> m.Event:
        if settle_first:
            # A server that just died may still hold GPU memory for a moment: the baseline
            # (and the learned-bytes guard) must not read that as another tenant's memory.
            wait_dead_processes_released(uuids, timeout=15)
        readings = self._services.gpus.free_memory(uuids)
        free = [readings[u].free_bytes if u in readings else None for u in uuids]
        # In learning order: this host's GPUs, then every follower's; None where unknown.
        return m.FreeMemoryRead((*free, *(free_bytes for _, free_bytes in self._follower_gpus(dep, strict=False))))

    def plan(
        self, dep: DeploymentSettings, overrides: BootOverrides, version: str | None, digest: str | None
    ) -> m.Event:
        services, name = self._services, self._name
        world, settings = services.world, services.world.settings
        runtime = self._runtimes.current(dep)
        host = services.gpus.host
        plan = world.planner(name, dep, host, replace(overrides, kv_cache_memory_bytes=None), version)
        for warning in plan.warnings:
            self._log.warning("plan_warning", warning=warning)
        uuids = plan.gpu_uuids
        if dep.swap_group is not None:
            facts = PlanFacts(plan.gpu_memory_utilization, plan.weights_bytes, plan.sleep_mode)
            services.swaps.record_plan(name, facts)
        boot_key = learning.boot_fingerprint(
            vllm=digest or version or plan.vllm_version,
            model=dep.model,
            revision=dep.revision,
            gpus=[
                *(GpuIdentity(g.name, g.memory_total_bytes) for g in _assigned(host, uuids)),
                *(identity for identity, _ in self._follower_gpus(dep, strict=True)),
            ],
            flags=(flags := learning.MemoryFlags.from_argv(plan.argv)),
        )
        seqs = flags.max_num_seqs
        self.max_num_seqs = int(seqs) if seqs is not None and seqs.isdigit() else None
        # A boot an earlier daemon left running holds its GPUs' slot (claimed at start-up) until ready.
        claimed = services.gpus.take_claimed_slot(name)
        if claimed is not None:
            self.release()
            self._slot = claimed
        found = runtime.find(name)
        handover, self.handover = self.handover, None
        if handover is not None:
            found = self._hand_over(runtime, handover) if found is None else self._discard(runtime, handover, found)
        snapshots = self.snapshots if found is not None and found.running else None
        left_restore = snapshots is not None and found is not None and snapshots.restore_left(found.pid)
        if snapshots is not None and found is not None and not left_restore:
            snapshots.repair_interrupted(dep, found.pid)  # a capture a killed daemon left midway
        kept = services.world.state.deployment(name)
        switched = kept.upgrade is not None and kept.upgrade.step == "switched"  # it can roll back: keep the old
        snapshot = (
            self.snapshots.verdict(dep, runtime, plan, digest, version, upgrade_switched=switched)
            if self.snapshots is not None
            else None
        )
        if left_restore and snapshots is not None and found is not None:
            if snapshot is not None and snapshot.state == "ready":
                found = None  # a restore a killed daemon left: the boot's restore takes it over, judged by the canary
            else:
                snapshots.repair_interrupted(dep, found.pid, restore_left=True)
        existing = None
        if found is not None:
            self._runtimes.seen(found.id, runtime)
            existing = m.ExistingWorkload(found.id, found.running, found.fingerprint == plan.fingerprint)
            if launching.is_launcher(found) and found.running:
                spec = workload_spec(plan, dep, settings, 0) if dep.uses_launcher else None
                existing = launching.found_launcher(found, launcher_run_dir(settings, name), spec, plan.fingerprint)
        sleeping = None
        server_runs = existing is not None and existing.running
        if existing is not None and existing.launcher is not None:
            server_runs = server_runs and existing.launcher.server_running
        if dep.swap_group is not None and server_runs:
            # A member an earlier daemon (killed with -9) left running may sleep: adopted asleep, not woken.
            sleeping = world.servers.is_sleeping(backend_address(settings, name, dep), api_key(dep))
        remembered, moving = (kept.asleep, kept.swapping) if dep.swap_group is not None else (None, None)
        return m.BootPlanned(
            uuids=uuids,
            boot_key=boot_key,
            learned=services.world.state.learned(name, boot_key),
            vllm_version=version or plan.vllm_version,
            planned_utilization=plan.gpu_memory_utilization,
            band_top=services.gpus.utilization_band_top(uuids),
            existing=existing,
            adoptable=runtime.adoptable(),
            sleeping=sleeping,
            remembered_asleep=m.SLEEP_LEVELS.get(remembered or ""),
            remembered_moving=m.SWAP_MOVES.get(moving or ""),
            # An upgrade's handed-over trial listens on a socket renamed under it, which a capture's restore
            # would put back under its old name (the gateway's requests then failed: the Podman upgrade test):
            # not captured now; its next boot plans its snapshot as any boot does.
            snapshot=None if handover is not None else snapshot,
        )

    def _hand_over(self, runtime: Runtime, workload: str) -> Workload | None:
        """An upgrade's trial server renamed to this deployment's workload, for the machine to adopt like a server
        an earlier daemon left (same plan: adopted; another: replaced). A runtime that cannot rename has it
        stopped and removed: the boot starts one instead."""
        name = self._name
        try:
            if runtime.rename(workload, name):
                self._log.info("handover", container_id=workload)
                return runtime.find(name)
        except DankserveError as exc:
            self._log.warning("handover_failed", container_id=workload, error=exc.message)
        return self._discard(runtime, workload, None)

    def _discard(self, runtime: Runtime, workload: str, found: Workload | None) -> Workload | None:
        """A workload handed over that cannot be adopted (its old one still there, or no rename) goes."""
        runtime.stop(workload, self._services.world.settings.stop_timeout_seconds)
        runtime.remove(workload)
        return found

    def start(
        self, dep: DeploymentSettings, overrides: BootOverrides, version: str | None, launcher_id: str | None
    ) -> m.Event:
        services, name = self._services, self._name
        world, settings = services.world, services.world.settings
        # A kept launcher's container publishes the port itself: the check is for a new workload.
        holder = world.servers.check_port(backend_address(settings, name, dep)) if launcher_id is None else None
        if holder is not None:
            return m.PortBusy(dep.port, holder)
        plan = world.planner(name, dep, services.gpus.host, overrides, version)
        boot = services.world.state.next_boot(name)
        # Both are mounted into the container; a missing source would fail the start.
        compile_cache_dir(settings, name).mkdir(parents=True, exist_ok=True, mode=0o700)
        settings.hf_cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        spec = workload_spec(plan, dep, settings, boot)
        timeout = self._machine().config.boot_timeout_seconds
        if launcher_id is not None:
            runtime = self._runtimes.of(launcher_id, dep)
            run_dir = launcher_run_dir(settings, name)
            return launching.start_server(runtime, launcher_id, run_dir, spec, boot, timeout=timeout, new=False)
        runtime = self._runtimes.current(dep)
        if spec.launcher is not None:
            spec.launcher.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        workload = runtime.start(spec)
        self._runtimes.seen(workload.id, runtime)
        if spec.launcher is not None:
            return launching.start_server(
                runtime, workload.id, spec.launcher.run_dir, spec, boot, timeout=timeout, new=True
            )
        return m.WorkloadStarted(workload.id, boot)

    def _follower_gpus(self, dep: DeploymentSettings, *, strict: bool) -> Sequence[tuple[GpuIdentity, int]]:
        """A group's followers' GPUs (none for a single host)."""
        found = self._services.world.cluster.follower_gpus
        return found(self._name, dep, strict) if found is not None and dep.hosts else ()


def _assigned(host: Host, uuids: tuple[str, ...]) -> list[Gpu]:
    by_uuid = {g.uuid: g for g in host.gpus}
    return [by_uuid[u] for u in uuids if u in by_uuid]
