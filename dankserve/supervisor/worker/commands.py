"""A worker's command interpreter: each machine command run against the world, its answer the event the
machine is stepped with next (None: no answer). The boot commands are `booting.Boots`', the records
`recording.Recorder`'s; here are the workload's: stop, remove, follow its log, wait for its exit,
probe /health, sleep and wake, and the commands about a launcher's server (issue 15).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal

from dankserve.backend_address import BackendAddress
from dankserve.plan.serve_args import served_name
from dankserve.plan.sleep_mode import has_sleep_mode
from dankserve.planning import backend_address
from dankserve.settings import DeploymentSettings
from dankserve.supervisor import machine as m
from dankserve.supervisor.fleet.swap_verify import SwapTarget, swap_target, workload_pids
from dankserve.supervisor.observe.swap_history import SwapCheck, swap_failure
from dankserve.supervisor.probes.health import check_health
from dankserve.supervisor.worker import launching
from dankserve.supervisor.worker.booting import Boots, api_key
from dankserve.supervisor.worker.log_pump import Inbox
from dankserve.supervisor.worker.recording import Recorder
from dankserve.supervisor.worker.services import WorkerServices
from dankserve.supervisor.worker.snapshots import SnapshotEdge
from dankserve.supervisor.worker.suspend import SuspendEdge
from dankserve.supervisor.worker.workload import launcher_run_dir
from dankserve.supervisor.worker.workloads import LogFollow, WorkloadRuntimes


class Commands:
    """Runs one deployment's commands."""

    def __init__(
        self,
        name: str,
        services: WorkerServices,
        inbox: Inbox,
        *,
        machine: Callable[[], m.MachineState],
        stopping: threading.Event,
        keep_launcher: Callable[[], bool],
        progress: Callable[[int], None],
        logger: Any,
    ) -> None:
        self._name = name
        self._machine = machine
        self._services = services
        self._log = logger
        self._progress = progress
        self.runtimes = WorkloadRuntimes(services.world.runtime_for)
        self.logs = LogFollow(name, inbox, logger)
        self.boots = Boots(
            name,
            services,
            self.runtimes,
            machine=machine,
            stopping=stopping,
            keep_launcher=keep_launcher,
            logger=logger,
        )
        self.records = Recorder(name, services, machine, logger)
        self.snapshots = SnapshotEdge(
            name,
            settings=lambda: services.world.settings,
            host=services.gpus.host,
            gpu=services.world.gpu_checkpoint,
            edges=services.world.servers,
            logger=logger,
        )
        self.boots.snapshots = self.snapshots
        self.suspender = SuspendEdge(services.world.gpu_checkpoint, logger)

    def run(self, command: m.Command, dep: DeploymentSettings) -> m.Event | None:
        """Run `command` for the deployment configured as `dep` now."""
        world = self._services.world
        stop_timeout = self._services.world.settings.stop_timeout_seconds
        match command:
            case m.Note(event=event, level=level, fields=fields):
                getattr(self._log, level)(event, **dict(fields))
            case m.EnsureWeights():
                return self.boots.fetch_weights(dep, self._progress)
            case m.EnsureImage():
                runtime = self.runtimes.current(dep)
                image_ref = (dep.executable or "") if dep.runtime == "process" else dep.image
                image = runtime.ensure_image(image_ref, dep.pull, lambda p: self._log.info("pull", status=p.status))
                return m.ImageReady(image.vllm_version or None, image.digest or None, image.entrypoint)
            case m.PlanBoot(overrides=overrides, vllm_version=version, digest=digest):
                return self.boots.plan(dep, overrides, version, digest)
            case m.StopWorkload(workload_id=wid):
                self.logs.unfollow(wid)
                self.runtimes.of(wid, dep).stop(wid, stop_timeout)
            case m.RemoveWorkload(workload_id=wid, best_effort=best_effort):
                self._remove(wid, dep, best_effort)
            case m.AcquireGpus(uuids=uuids):
                return self.boots.acquire_gpus(uuids)
            case m.ReleaseGpus():
                self.boots.release()
            case m.ReadFreeMemory(uuids=uuids, settle_first=settle_first):
                return self.boots.read_free_memory(uuids, settle_first, dep)
            case m.StartWorkload(overrides=overrides, vllm_version=version, launcher_id=launcher_id):
                return self.boots.start(dep, overrides, version, launcher_id)
            case m.CheckPort():
                holder = world.servers.check_port(self._address(dep))
                return m.PortFree() if holder is None else m.PortBusy(dep.port, holder)
            case m.StopServer() | m.WaitExit(server=int()):
                return self._launcher_command(command, dep)
            case m.RemoveLauncher():
                self._remove_launcher(dep)
            case m.FollowLogs(workload_id=wid, resume=resume, server=server):
                self.logs.follow(self.runtimes.of(wid, dep), wid, resume=resume, server=server)
            case m.WaitExit(workload_id=wid, timeout=timeout):
                ended = self.runtimes.of(wid, dep).wait(wid, timeout=timeout)
                return m.StillRunning() if ended is None else m.Exited(ended.exit_code, ended.oom_killed)
            case m.ProbeHealth(timeout=timeout):
                return self._probe_health(dep, timeout)
            case m.WarmUp(timeout=timeout):
                began = time.monotonic()
                model = served_name(dep.served_model_name, dep.extra_args, dep.model)
                outcome = world.servers.warm_up(self._address(dep), model, api_key(dep), timeout)
                return m.WarmedUp(outcome.error, time.monotonic() - began, outcome.unwarmed)
            case m.CountGpuTenants(uuids=uuids):
                others, free = self._services.gpus.tenants(uuids)
                return m.GpuTenants(others, world.draw(), free)
            case m.SleepServer() | m.WakeServer():
                return self._swap(dep, command)
            case m.CaptureSnapshot(workload_id=wid):
                return self._capture(dep, wid)
            case m.RestoreSnapshot():
                return self._restore(dep)
            case m.MarkSleepUnsafe(level=level, reason=reason, check=check):
                self._services.telemetry.swap_check_failed(self._name, check)
                if self._services.swap_verifier is not None:
                    version = self._machine().vllm_version
                    self._services.swap_verifier.mark_unsafe(self._name, dep.model, version, level, reason)
            case _:
                self.records.record(command)
        return None

    def _capture(self, dep: DeploymentSettings, workload_id: str) -> m.Event:
        """The ready server captured (issue 41), counted."""
        captured = self.snapshots.capture(dep, self.runtimes.of(workload_id, dep), workload_id)
        outage = captured.outage_seconds if isinstance(captured, m.SnapshotCaptured) else None
        self._services.telemetry.snapshot_event(
            self._name, "captured" if outage is not None else "capture_failed", outage
        )
        return captured

    def _restore(self, dep: DeploymentSettings) -> m.Event:
        """A snapshot restored in a boot's place: counted as a boot once it serves."""
        runtime = self.runtimes.current(dep)
        event = self.snapshots.restore(dep, runtime, 0)
        telemetry = self._services.telemetry
        if isinstance(event, m.Restored):
            telemetry.snapshot_event(self._name, "restored", event.seconds)
            self.runtimes.seen(event.workload_id, runtime)
            return replace(event, boot=self._services.world.state.next_boot(self._name))
        telemetry.snapshot_event(self._name, "restore_fallback")
        return event

    def _address(self, dep: DeploymentSettings) -> BackendAddress:
        """Where the deployment's server listens (its private socket, or TCP)."""
        return backend_address(self._services.world.settings, self._name, dep)

    def _remove(self, workload_id: str, dep: DeploymentSettings, best_effort: bool) -> None:
        self.logs.unfollow(workload_id)
        try:
            self.runtimes.of(workload_id, dep).remove(workload_id)
        except Exception as exc:
            if not best_effort:
                raise
            self._log.warning("remove_failed", container_id=workload_id, error=str(exc))
        self.runtimes.forget(workload_id)

    def _probe_health(self, dep: DeploymentSettings, timeout: float) -> m.Event | None:
        """/health of the server, and whether a sleep-mode server sleeps (None: no verdict, probed again)."""
        servers, address = self._services.world.servers, self._address(dep)
        if servers.health is not None:
            return servers.health(address, timeout)
        result = check_health(address, timeout=timeout)
        if result.own_error:  # out of descriptors or memory here: no verdict on the server, probed again
            self._log.warning("health_probe_not_sent", error=result.error)
            return None
        # Dev mode's /sleep is open to whoever reaches a TCP port: a sleep dankserve did not ask for is noticed.
        sleeping = result.healthy and has_sleep_mode(dep) and servers.is_sleeping(address, api_key(dep))
        return m.HealthChecked(result.status, result.error, sleeping=bool(sleeping))

    def _launcher_command(self, command: m.StopServer | m.WaitExit, dep: DeploymentSettings) -> m.Event | None:
        """The commands about a launcher's server (issue 15)."""
        settings = self._services.world.settings
        run_dir = launcher_run_dir(settings, self._name)
        if isinstance(command, m.StopServer):
            self.logs.unfollow(command.workload_id)
            launching.stop_server(run_dir, settings.stop_timeout_seconds)
            return None
        wid = command.workload_id
        return launching.wait_server(self.runtimes.of(wid, dep), wid, run_dir, command.timeout)

    def _remove_launcher(self, dep: DeploymentSettings) -> None:
        """The deployment's launcher, kept running without a server, goes (best effort: the daemon is stopping)."""
        if not dep.uses_launcher:
            return
        try:
            stop_timeout = self._services.world.settings.stop_timeout_seconds
            removed = launching.remove_launcher(self.runtimes.current(dep), self._name, stop_timeout)
        except Exception as exc:
            self._log.warning("launcher_remove_failed", error=str(exc))
            return
        if removed is not None:
            self.logs.unfollow(removed)
            self.runtimes.forget(removed)
            self._log.info("launcher_removed", container_id=removed)

    def _swap(self, dep: DeploymentSettings, command: m.SleepServer | m.WakeServer) -> m.Event:
        """Sleep or wake, its checks kept in the swap history (with the failure, when it failed)."""
        checks: list[SwapCheck] = []
        event = self._sleep_or_wake(dep, command, checks)
        kind: Literal["sleep", "wake"] = "wake" if isinstance(command, m.WakeServer) else "sleep"
        self._services.telemetry.swaps.checked(
            self._name,
            kind,
            checks,
            failure=swap_failure(event),
            level=command.level,
            group=dep.swap_group,
            at=self._services.world.clock.time(),
            still_ends=isinstance(event, m.SuspendFailed),
        )
        return event

    def _sleep_or_wake(
        self, dep: DeploymentSettings, command: m.SleepServer | m.WakeServer, checks: list[SwapCheck]
    ) -> m.Event:
        """Sleep at level 1 or 2 through vLLM's route, or (`stop`) stop and remove the server; or wake it."""
        world, verifier = self._services.world, self._services.swap_verifier
        servers, clock = world.servers, world.clock
        workload_id, level, key = command.workload_id, command.level, api_key(dep)
        runtime = self.runtimes.of(workload_id, dep)
        target = swap_target(
            self._name,
            dep,
            self._machine(),
            key,
            lambda: workload_pids(runtime, workload_id),
            address=self._address(dep),
        )
        if level == "suspend":  # level 1 and the GPU checkpoint (issue 41 item 7)
            return self._suspend_or_resume(dep, command, target, checks)
        if isinstance(command, m.WakeServer):

            def wake() -> m.Event:
                return servers.wake_server(self._address(dep), key, level)

            return wake() if verifier is None else verifier.wake(target, wake, checks)
        if level != "stop":

            def sleep() -> m.Event:
                return servers.sleep_server(self._address(dep), key, level)

            return sleep() if verifier is None else verifier.sleep(target, sleep, checks)
        started = clock.monotonic()
        settings = self._services.world.settings
        self.logs.unfollow(workload_id)
        if command.server is not None:  # the launcher stays: the wake asks it for a new server
            launching.stop_server(launcher_run_dir(settings, self._name), settings.stop_timeout_seconds)
            return m.FellAsleep(clock.monotonic() - started)
        runtime = self.runtimes.of(workload_id, dep)
        runtime.stop(workload_id, settings.stop_timeout_seconds)
        runtime.remove(workload_id)
        self.runtimes.forget(workload_id)
        return m.FellAsleep(clock.monotonic() - started)

    def _suspend_or_resume(
        self,
        dep: DeploymentSettings,
        command: m.SleepServer | m.WakeServer,
        target: SwapTarget,
        checks: list[SwapCheck],
    ) -> m.Event:
        """Sleep level `suspend`: vLLM's level 1, then the GPU checkpoint of the server's CUDA processes (a failed
        one undone: plain level 1, the reason said); its wake restores and unlocks them, then vLLM's level-1 wake
        (a failed restore is a failed wake). Verified as the other levels: 0 bytes asleep, the canary awake."""
        servers, clock, verifier = (
            self._services.world.servers,
            self._services.world.clock,
            self._services.swap_verifier,
        )
        address, key = self._address(dep), api_key(dep)
        if isinstance(command, m.WakeServer):

            def wake() -> m.Event:
                started = clock.monotonic()
                problem = self.suspender.resume(target.pids())
                if problem is not None:
                    return m.WakeFailed(f"the GPU restore of the suspended server failed: {problem.reason}")
                event = servers.wake_server(address, key, "1")
                return m.WokeUp(clock.monotonic() - started) if isinstance(event, m.WokeUp) else event

            return wake() if verifier is None else verifier.wake(target, wake, checks)

        def sleep() -> m.Event:
            started = clock.monotonic()
            # Asleep already (a suspend sent again by a daemon following one killed midway): /sleep is not sent
            # again, as it would wait on a GPU-locked engine; the GPU steps follow the processes' states.
            if servers.is_sleeping(address, key) is not True:
                event = servers.sleep_server(address, key, "1")
                if not isinstance(event, m.FellAsleep):
                    return event
            problem = self.suspender.suspend(target.pids())
            if problem is not None:
                self._log.warning("suspend_undone", reason=problem.reason, lasting=problem.lasting)
                return m.SuspendFailed(clock.monotonic() - started, problem.reason, problem.lasting)
            return m.FellAsleep(clock.monotonic() - started)

        return sleep() if verifier is None else verifier.sleep(target, sleep, checks, suspend=True)
