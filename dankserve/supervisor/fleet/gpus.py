"""The host's GPUs as the daemon uses them: the host probed at start, their memory read now (NVML, or the
recorded host file that drives a test or demo run), their boot slots, and the slots claimed at start-up
for the workloads an earlier daemon left running."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import structlog

from dankserve.host.gpu_memory import GpuMemory, read_gpu_memory, read_nvml
from dankserve.host.model import Host
from dankserve.plan.rules import smallest_gpu, utilisation_row
from dankserve.runtime.base import Runtime
from dankserve.settings import DeploymentSettings
from dankserve.supervisor.edges import Planner
from dankserve.supervisor.fleet.gpu_slots import BootSlot, GpuBootLocks
from dankserve.supervisor.machine import BootOverrides
from dankserve.supervisor.records import StateBook

log = structlog.get_logger("dankserve")


class HostGpus:
    """This host's GPUs: readings, boot slots and start-up claims (thread-safe)."""

    def __init__(self, host: Host, hardware_file: Path | None) -> None:
        self.host = host
        self._hardware_file = hardware_file
        self.slots = GpuBootLocks()
        self.hardware_file = hardware_file
        """The recorded host file (None: a real host): the stand-in's records lie beside it."""
        self._claimed: dict[str, BootSlot] = {}
        self._lock = threading.Lock()

    def claim(self, name: str, uuids: tuple[str, ...]) -> None:
        """At start-up: the slot of a running workload's GPUs, kept for its worker (none when taken)."""
        slot = self.slots.try_acquire(uuids)
        if slot is not None:
            with self._lock:
                self._claimed[name] = slot

    def claim_running_boots(
        self,
        deployments: Mapping[str, DeploymentSettings],
        runtime_for: Callable[[DeploymentSettings], Runtime],
        planner: Planner,
        state: StateBook,
    ) -> None:
        """Before any worker starts: give each workload an earlier daemon left running its GPUs' boot slot.

        Its worker adopts it and keeps the slot until it is ready, so no other deployment on those
        GPUs starts booting meanwhile (workers start in no fixed order; this runs before all of them).
        Anything that fails here is left to the worker, which looks again.
        """
        for name, dep in deployments.items():
            try:
                existing = runtime_for(dep).find(name)
                if existing is None or not existing.running:
                    continue
                overrides = BootOverrides.from_remediation(state.deployment(name).overrides)
                uuids = planner(name, dep, self.host, overrides, None).gpu_uuids
            except Exception as exc:
                log.warning("claim_skipped", deployment=name, error=str(exc))
                continue
            self.claim(name, uuids)

    def take_claimed_slot(self, name: str) -> BootSlot | None:
        """The boot slot claimed at start-up for the deployment's running workload (once), if any."""
        with self._lock:
            return self._claimed.pop(name, None)

    def memory(self, uuids: tuple[str, ...]) -> dict[str, GpuMemory]:
        return read_gpu_memory(uuids, self._hardware_file, self.host)

    def all_memory(self) -> dict[str, GpuMemory]:
        """Every GPU of the host (the observatory's reading)."""
        return self.memory(tuple(g.uuid for g in self.host.gpus))

    def free_memory(self, uuids: tuple[str, ...]) -> dict[str, GpuMemory]:
        """Free memory for boot learning: the recorded host file when one drives this run, else NVML.

        Never the start-up snapshot: a GPU NVML cannot read now is left out (unknown), and an
        unknown reading never passes the learned-bytes guard."""
        if self._hardware_file is not None:
            return self.memory(uuids)
        return read_nvml(uuids) or {}

    def utilization_band_top(self, uuids: tuple[str, ...]) -> float | None:
        """The top of the utilisation table band of the smallest of these GPUs."""
        gpus = [g for g in self.host.gpus if g.uuid in uuids]
        return utilisation_row(smallest_gpu(gpus)).top if gpus else None

    def other_processes(self, uuids: tuple[str, ...]) -> bool | None:
        """NVML lists compute processes on these GPUs (ours are stopped when this is asked); None: unknown.

        A recorded host file (stand-in GPUs) lists no processes: none."""
        return self.tenants(uuids)[0]

    def tenants(self, uuids: tuple[str, ...]) -> tuple[bool | None, tuple[int | None, ...]]:
        """`other_processes`, and each GPU's free bytes in `uuids`' order (None: unknown), from one reading
        (what the failure policy weighs after an OOM)."""
        if self._hardware_file is not None:
            memory = self.memory(uuids)
            return False, tuple(memory[u].free_bytes if u in memory else None for u in uuids)
        readings = read_nvml(uuids)
        if readings is None:
            return None, tuple(None for _ in uuids)
        free = tuple(readings[u].free_bytes if u in readings else None for u in uuids)
        if any(r.other_processes is None for r in readings.values()):
            return None, free
        return any((r.other_processes or 0) > 0 for r in readings.values()), free

    def index_of(self) -> dict[str, int]:
        """Each GPU's index by its UUID (what status and messages call it)."""
        return {g.uuid: g.index for g in self.host.gpus}
