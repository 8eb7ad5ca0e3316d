"""The fleet: the deployments one daemon supervises, their workers, and each one's `DeploymentView`.

It is what the rest of the supervisor reads of the daemon: the swap groups (as their `SwapFleet`),
status, the control requests, `/metrics` and the gateway link. Workers are added, taken down and
retired only under its lock; readers take a `snapshot()`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from dankserve.planning import backend_address, client_endpoint
from dankserve.settings import Settings
from dankserve.supervisor import machine as m
from dankserve.supervisor.clock import Clock
from dankserve.supervisor.edges import RuntimeFactory
from dankserve.supervisor.lifecycle import Phase
from dankserve.supervisor.observe.status import DeploymentView, Metrics, deployment_view
from dankserve.supervisor.observe.telemetry import Telemetry
from dankserve.supervisor.probes.observatory import Observatory, ServingTarget
from dankserve.supervisor.records import StateBook
from dankserve.supervisor.worker import DeploymentWorker, launching

log = structlog.get_logger("dankserve")

HostsOf = Callable[[str], list[dict[str, Any]] | None]
"""The hosts of a multi-host deployment for `status` (None: a single-host one)."""
HeldBy = Callable[[Sequence[int], Sequence[str]], "dict[str, int] | None"]
"""GPU memory given processes hold on each given GPU (swap_verify.HeldBytes)."""


@dataclass(frozen=True)
class StatusReadings:
    """What only `dankserve status` reads for its views (a runtime and NVML call per deployment: /metrics does
    without them): the GPU memory each server's processes hold, and each swap member's idle countdown."""

    held: HeldBy
    idle_sleep_in: Callable[[str], float | None]


class Fleet:
    """The deployments of one daemon and their workers."""

    def __init__(
        self,
        settings: Callable[[], Settings],
        state: StateBook,
        *,
        clock: Clock,
        telemetry: Telemetry,
        observatory: Observatory,
        describe_hosts: HostsOf | None = None,
    ) -> None:
        self._settings = settings
        self.state = state
        self.clock = clock
        self._telemetry = telemetry
        self._observatory = observatory
        self._describe_hosts = describe_hosts
        self._lock = threading.RLock()
        self._workers: dict[str, DeploymentWorker] = {}
        self._retiring: list[DeploymentWorker] = []
        """Workers told to stop by a reload, still stopping: reaped by the main loop, never waited on there."""
        self._restarting: set[str] = set()
        """Deployments between their old worker's stop and their new worker's start (`dankserve restart`)."""

    @property
    def settings(self) -> Settings:
        """The running settings."""
        return self._settings()

    # -- the workers ------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, DeploymentWorker]:
        """The workers now (a copy: the control thread may add or remove some meanwhile)."""
        with self._lock:
            return dict(self._workers)

    def get(self, name: str) -> DeploymentWorker | None:
        with self._lock:
            return self._workers.get(name)

    def add(self, worker: DeploymentWorker, *, unless_running: bool = False) -> None:
        """Start `worker` for its deployment; `unless_running`: not when one already runs it (the start-up loop
        races `dankserve up NAME`, answered on the control socket meanwhile: two workers booted two servers)."""
        with self._lock:
            existing = self._workers.get(worker.name)
            if unless_running and existing is not None and existing.alive:
                return
            self._workers[worker.name] = worker
            worker.start()  # under the lock: a worker others can see is alive

    def retire(self, worker: DeploymentWorker) -> None:
        """`worker` is told to stop and leaves the fleet; it is reaped once it ended (never waited for here)."""
        worker.request_stop()
        with self._lock:
            self._workers.pop(worker.name, None)
            self._retiring.append(worker)

    def reap(self) -> None:
        """Forget the retired workers that ended."""
        with self._lock:
            self._retiring = [w for w in self._retiring if w.alive]

    def take_down(self, name: str) -> DeploymentWorker | None:
        """Remembered as down; its worker (if any) leaves the fleet and is returned, for the caller to stop."""
        with self._lock:
            self.state.set_down(name, True)
            return self._workers.pop(name, None)

    def bring_up(self, name: str, make: Callable[[], DeploymentWorker]) -> None:
        """No longer down; a worker made by `make` is started unless one runs."""
        with self._lock:
            self.state.set_down(name, False)
            existing = self._workers.get(name)
            if existing is None or not existing.alive:
                self.add(make())

    def leave_for_restart(self, name: str) -> DeploymentWorker | None:
        """`dankserve restart NAME`: its worker leaves the fleet (returned, for the caller to stop) while the
        deployment counts as restarting, not down: the gateway queues its requests meanwhile."""
        with self._lock:
            self._restarting.add(name)
            return self._workers.pop(name, None)

    def restarted(self, name: str, make: Callable[[], DeploymentWorker]) -> None:
        """The end of a restart: the new worker runs (as `bring_up`), the deployment no longer restarting."""
        with self._lock:
            try:
                self.bring_up(name, make)
            finally:
                self._restarting.discard(name)

    def restarting(self, name: str) -> bool:
        """Between the old worker's stop and the new one's start (`dankserve restart`)."""
        with self._lock:
            return name in self._restarting

    def stop_all(self, timeout: float, failed: Callable[[str], None], runtime_for: RuntimeFactory) -> None:
        """Stop every worker (retired ones too), waiting up to `timeout` s in all; a worker still stopping then
        is `failed`. SIGTERM leaves nothing running: the launchers of deployments without a running worker go
        too (kept by `down`, or idle after the deployment failed)."""
        with self._lock:
            workers = [*self._workers.values(), *self._retiring]
        for worker in workers:
            worker.request_stop()
        deadline = time.monotonic() + timeout
        for worker in workers:
            worker.join(max(0.1, deadline - time.monotonic()))
        for worker in workers:
            if worker.alive:  # still stopping at the deadline: its server may outlive the daemon
                failed(worker.name)
        # A worker that ended (stopped, or failed: its launcher idles on for `up`) stops nothing more itself.
        supervised = {w.name for w in workers if w.alive}
        entrypoints = {w.name: w.machine.image_entrypoint for w in workers}  # what launcher = "auto" decided by
        settings = self.settings
        for name, dep in settings.deployments.items():
            if name in supervised or not dep.with_image_entrypoint(entrypoints.get(name)).uses_launcher:
                continue
            try:
                removed = launching.remove_launcher(runtime_for(dep), name, settings.stop_timeout_seconds)
                if removed is not None:
                    log.info("launcher_removed", deployment=name, container_id=removed)
            except Exception as exc:
                log.warning("launcher_remove_failed", deployment=name, error=str(exc))

    def serving_targets(self) -> list[ServingTarget]:
        """The ready deployments, whose /metrics the observatory reads."""
        targets = []
        for name, worker in self.snapshot().items():
            if worker.machine.stage is m.Stage.READY:
                with worker.lock:
                    dep = worker.dep
                targets.append(ServingTarget(name, backend_address(self.settings, name, dep)))
        return targets

    # -- views ------------------------------------------------------------------------------------
    def views(self, *, with_hosts: bool = True, readings: StatusReadings | None = None) -> list[DeploymentView]:
        """Every configured deployment's view, by name."""
        workers = self.snapshot()
        return [
            self.view(name, workers.get(name), with_hosts=with_hosts, readings=readings)
            for name in sorted(self.settings.deployments)
        ]

    def view(
        self,
        name: str,
        worker: DeploymentWorker | None,
        *,
        with_hosts: bool = True,
        readings: StatusReadings | None = None,
    ) -> DeploymentView:
        """The deployment as status, /metrics and `sleep`/`wake` show it (`readings`: status's own)."""
        dep = self.state.as_run(name, self.settings.deployments[name])  # the image it runs
        record = self.state.deployment(name)
        observatory = self._observatory
        machine = worker.machine if worker is not None else None
        by_gpu = None
        if readings is not None and worker is not None and machine is not None and machine.gpu_uuids:
            by_gpu = readings.held(worker.server_pids(), machine.gpu_uuids)
        gpus = []
        if machine is not None and machine.gpu_uuids:
            for uuid, reading in observatory.gpus(machine.gpu_uuids).items():
                gpus.append(
                    {
                        "index": reading.index,
                        "memory_used_bytes": reading.used_bytes,
                        "memory_total_bytes": reading.total_bytes,
                        "held_bytes": by_gpu.get(uuid) if by_gpu else None,  # its own share of this GPU
                    }
                )
        # vLLM's numbers as the observatory last read them (the same ones /metrics relays).
        sample = observatory.sample(name) if machine is not None and machine.phase is Phase.READY else None
        metrics = None
        if sample is not None:
            preemptions = sample.preemptions_total
            metrics = Metrics(int(preemptions) if preemptions is not None else None, sample.kv_cache_usage_perc)
        hosts = self._describe_hosts(name) if with_hosts and self._describe_hosts is not None else None
        held = sum(by_gpu.values()) if by_gpu else None
        return deployment_view(
            name,
            dep,
            record,
            machine,
            down=self.state.is_down(name),
            now=self.clock.monotonic(),
            gpus=gpus,
            metrics=metrics,
            hosts=hosts,
            serving=None if sample is None else sample.as_json(),
            observed=self._telemetry.of(name),
            waiting_for=worker.waiting_for if worker is not None else None,
            phase_since=worker.phase_since if worker is not None else None,
            wall_now=self.clock.time(),
            address=backend_address(self.settings, name, dep),
            endpoint=client_endpoint(self.settings, name, dep),
            held_bytes=held,
            idle_sleep_in=readings.idle_sleep_in(name) if readings is not None and worker is not None else None,
        )
