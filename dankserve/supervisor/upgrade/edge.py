"""The daemon's side of an upgrade (`supervisor.upgrade.driver.UpgradeEdge`): pulls through the runtime,
plans through the daemon's planner, makes room through the deployment's worker (sleep level 1 or stop),
boots the new server as a trial workload beside it on an address of its own (a socket beside the old
one's, or a free port), and measures both.

The trial is the deployment's workload under the name `NAME.upgrade` (`trial_name`): a daemon that
follows one killed with -9 finds it by that name and removes it before any server boots."""

from __future__ import annotations

import os
import queue
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

import structlog

from dankserve.backend_address import BackendAddress, TcpAddress, UnixAddress
from dankserve.bootlog.reader import BootLogReader, read_boot_facts
from dankserve.errors import DankserveError
from dankserve.host.model import Host
from dankserve.plan.catalogue import capabilities
from dankserve.plan.serve_args import served_name
from dankserve.plan.types import Plan
from dankserve.planning import TRIAL_SOCKET, backend_address, compile_cache_dir
from dankserve.runtime.base import PullPolicy, PullProgress, Runtime, WorkloadSpec
from dankserve.secret_files import read_key_now
from dankserve.settings import DeploymentSettings, Settings
from dankserve.supervisor import machine as m
from dankserve.supervisor.clock import Clock
from dankserve.supervisor.fleet import swap
from dankserve.supervisor.fleet.coordinator import LOOK_SECONDS, FleetCoordinator
from dankserve.supervisor.fleet.gpus import HostGpus
from dankserve.supervisor.probes.health import check_health
from dankserve.supervisor.records import StateBook
from dankserve.supervisor.upgrade import (
    Measured,
    Measurement,
    NewBooted,
    NewFailed,
    NewStopped,
    OldMeasured,
    OldRestored,
    OldStopped,
    Pulled,
    PullFailed,
    Replanned,
    RoomMade,
    VersionRead,
    flags_gone,
    plan_changes,
)
from dankserve.supervisor.upgrade.probe import ProbeFailed, measure
from dankserve.supervisor.worker.workload import workload_spec
from dankserve.supervisor.world import World


class UpgradeWorker(Protocol):
    """What an upgrade reads of a deployment's worker, and asks of it."""

    @property
    def machine(self) -> m.MachineState: ...

    @property
    def alive(self) -> bool: ...

    def feed(self, event: m.Event) -> None: ...

    def request_replan(self, dep: DeploymentSettings, handover: str | None = None) -> None: ...


class UpgradeWorkers(Protocol):
    """The daemon's workers (`fleet.Fleet`) and its clock."""

    @property
    def clock(self) -> Clock: ...

    def snapshot(self) -> Mapping[str, UpgradeWorker]: ...


@dataclass(frozen=True)
class UpgradeFleet:
    """What an upgrade uses of the daemon (never the daemon itself): its world (settings, state, host, planner,
    runtimes), its workers, the fleet coordinator (the only author of sleep and wake: the upgrade's hold) and the
    GPUs' boot slots (the trial takes one as any boot does). The image an upgrade switches to is kept in `state`."""

    world: World
    fleet: UpgradeWorkers
    coordinator: FleetCoordinator
    gpus: HostGpus

    @property
    def settings(self) -> Settings:
        return self.world.settings

    @property
    def state(self) -> StateBook:
        return self.world.state

    @property
    def host(self) -> Host:
        return self.world.host


log = structlog.get_logger("dankserve.upgrade")

DRAIN_SECONDS = 30.0
"""How long making room waits for the old server's requests in flight (the gateway sends no new ones)."""
POLL_SECONDS = 0.25


def trial_name(deployment: str) -> str:
    """The trial server's deployment name (its workload and container name derive from it)."""
    return f"{deployment}.upgrade"


def free_port(host: str) -> int:
    """A port nothing listens on now, for the trial server."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host if host not in ("0.0.0.0", "::") else "", 0))
        port: int = probe.getsockname()[1]
        return port


class DaemonUpgradeEdge:
    """One upgrade's actions on the running daemon."""

    def __init__(
        self, daemon: UpgradeFleet, name: str, pull: PullPolicy = "missing", *, hand_over: bool = False
    ) -> None:
        self._daemon = daemon
        self._name = name
        self._pull = pull
        self._hand_over = hand_over
        """Whether the switch hands the trial server over (a live upgrade; a recovery stops it)."""
        self._trial_id: str | None = None
        self.handed_over: str | None = None
        """The trial server the switch handed over to the deployment's worker (None: it was stopped)."""
        self._version: str | None = None
        self._digest: str | None = None
        self._plan: Plan | None = None
        self._trial: BackendAddress | None = None

    # -- what is read ------------------------------------------------------------------------------
    @property
    def _dep(self) -> DeploymentSettings:
        """The deployment as it runs (the image an earlier upgrade switched it to)."""
        return self._daemon.state.as_run(self._name, self._daemon.settings.deployments[self._name])

    def _runtime(self) -> Runtime:
        return self._daemon.world.runtime_for(self._dep)

    def _worker(self) -> UpgradeWorker | None:
        return self._daemon.fleet.snapshot().get(self._name)

    def _new_dep(self, image: str) -> DeploymentSettings:
        return self._dep.model_copy(update={"image": image})

    def _measure(self, address: BackendAddress, kv_tokens: int | None) -> Measurement:
        dep = self._dep
        key = read_key_now(dep.api_key_file) if dep.api_key_file is not None else None
        model = served_name(dep.served_model_name, dep.extra_args, dep.model)
        return measure(address, model, key, kv_cache_tokens=kv_tokens)

    # -- the actions -------------------------------------------------------------------------------
    def pull(self, image: str, progress: Callable[[float], None]) -> Pulled | PullFailed:
        def report(event: PullProgress) -> None:
            if event.total_bytes and event.current_bytes is not None:
                progress(round(min(100.0, 100.0 * event.current_bytes / event.total_bytes), 1))

        try:
            info = self._runtime().ensure_image(image, self._pull, report)
        except DankserveError as exc:
            return PullFailed(exc.message)
        self._version = info.vllm_version or self._daemon.settings.vllm_version
        self._digest = info.digest
        return Pulled(info.digest)

    def read_version(self, image: str) -> VersionRead:
        return VersionRead(self._version)

    def replan(self, image: str, version: str | None) -> Replanned:
        try:
            plan = self._daemon.world.planner(
                self._name, self._new_dep(image), self._daemon.host, m.BootOverrides(), version
            )
        except DankserveError as exc:  # e.g. a flag of extra_args the new release removed: the fix names its successor
            return Replanned((), f"{exc.message} (fix: {exc.fix})" if exc.fix else exc.message)
        self._plan = plan
        caps = capabilities(version)
        return Replanned(flags_gone(plan.argv, caps.flags), changes=plan_changes(self._old_plan(), plan))

    def _old_plan(self) -> Plan | None:
        """The running release's plan, to name what the new one changes (None: it cannot be planned now)."""
        worker = self._worker()
        version = worker.machine.vllm_version if worker is not None else None
        try:
            return self._daemon.world.planner(self._name, self._dep, self._daemon.host, m.BootOverrides(), version)
        except DankserveError:
            return None

    def measure_old(self) -> OldMeasured:
        worker = self._worker()
        boot = worker.machine.boot if worker is not None else None
        kv = boot.facts.gpu_kv_cache_tokens if boot is not None else None
        try:
            return OldMeasured(self._measure(backend_address(self._daemon.settings, self._name, self._dep), kv))
        except ProbeFailed as exc:
            log.warning("upgrade_old_not_measured", deployment=self._name, error=str(exc))
            return OldMeasured(Measurement(kv, None))

    def make_room(self) -> RoomMade:
        """The old server sleeps (level 1) or stops, asked of the fleet coordinator, which holds its GPUs for
        the trial from now on: no other member of its swap group is woken or booted onto them."""
        coordinator, name = self._daemon.coordinator, self._name
        coordinator.wait_until(lambda: coordinator.in_flight(name) == 0, DRAIN_SECONDS)
        worker = self._worker()
        if worker is None or worker.machine.stage is not m.Stage.READY:
            return RoomMade("stop", "the old server was not serving")
        level: m.SleepLevel = "stop"
        why = "it is in no swap group (no sleep mode): stopped, booted again on rollback"
        if self._dep.swap_group is not None:
            choice = coordinator.sleep_level(name, worker.machine)
            why = choice.reason
            if choice.level is swap.SleepLevel.SUSPEND:  # an upgrade sleeps and rolls back at level 1 or stop only
                why = f"{why}; an upgrade's old server sleeps at level 1"
            if choice.level in (swap.SleepLevel.LEVEL_1, swap.SleepLevel.SUSPEND):
                level = "1"
        coordinator.hold_for_upgrade(name, worker.machine.gpu_uuids)
        error = coordinator.sleep(name, "upgrade: making room for the new server", by="upgrade", level=level)
        if error is not None:
            log.warning("upgrade_room_not_made", deployment=name, error=error)
        coordinator.wait_until(
            lambda: worker.machine.stage is m.Stage.ASLEEP or not worker.alive,
            self._daemon.settings.stop_timeout_seconds + 30,
        )
        return RoomMade("1" if level == "1" else "stop", why)

    def boot_new(self, image: str, version: str | None) -> NewBooted | NewFailed:
        daemon, dep = self._daemon, self._dep
        plan = self._plan
        if plan is None:
            return NewFailed("no plan for the new image")
        try:
            trial = backend_address(daemon.settings, self._name, dep, TRIAL_SOCKET)
        except DankserveError as exc:
            return NewFailed(exc.message)
        if isinstance(trial, TcpAddress):
            trial = TcpAddress(dep.host, free_port(dep.host))
        self._trial = trial
        compile_cache_dir(daemon.settings, self._name).mkdir(parents=True, exist_ok=True, mode=0o700)
        spec = workload_spec(plan, self._new_dep(image), daemon.settings, 0)
        spec = replace(
            spec,
            deployment=trial_name(self._name),
            port=trial.port if isinstance(trial, TcpAddress) else spec.port,
            socket=trial.path if isinstance(trial, UnixAddress) else None,
            pull="never",
            launcher=None,
        )
        holder = daemon.world.servers.check_port(trial)  # the same check as any boot's: a port someone holds is named
        if holder is not None:
            return NewFailed(f"the trial's address {trial} is held by {holder}")
        # The GPUs' boot slot, as any boot takes it: no other boot on these GPUs measures or starts meanwhile.
        slot = daemon.gpus.slots.acquire(plan.gpu_uuids, threading.Event(), holder=trial_name(self._name))
        try:
            return self._start_trial(spec, trial)
        finally:
            if slot is not None:
                slot.release()

    def _start_trial(self, spec: WorkloadSpec, trial: BackendAddress) -> NewBooted | NewFailed:
        daemon = self._daemon
        runtime = self._runtime()
        try:
            workload = runtime.start(spec)
        except DankserveError as exc:
            return NewFailed(exc.message)
        self._trial_id = workload.id
        # Ready by the lifecycle's rule: this boot's log said `Application startup complete.` and /health answers
        # 200 (a server left on the address cannot pass for it); waits on the daemon's clock.
        clock = daemon.fleet.clock
        nothing: queue.Queue[None] = queue.Queue()
        deadline = clock.monotonic() + daemon.settings.boot_timeout_seconds
        while clock.monotonic() < deadline:
            found = runtime.inspect(workload.id)
            if found is None or not found.running:
                lines = list(runtime.logs(workload.id))
                facts = read_boot_facts(lines)
                code = found.exit_code if found is not None else None
                why = facts.failure_message or " | ".join(lines[-3:])
                return NewFailed(f"exited with {code}: {why[-400:]}", workload.id)
            if check_health(trial).healthy and read_boot_facts(runtime.logs(workload.id)).ready:
                return NewBooted(workload.id)
            clock.wait(nothing, POLL_SECONDS)
        return NewFailed(f"not ready within {daemon.settings.boot_timeout_seconds:g} s", workload.id)

    def measure_new(self, workload: str) -> Measured | NewFailed:
        reader = BootLogReader()
        for line in self._runtime().logs(workload):
            reader.feed(line)
        trial = self._trial
        if trial is None:
            return NewFailed("the new server's address is unknown")
        try:
            return Measured(self._measure(trial, reader.facts.gpu_kv_cache_tokens))
        except ProbeFailed as exc:
            return NewFailed(str(exc))

    def stop_trial(self, workload: str | None) -> bool:
        """Stop and remove the trial server (found by name when its id is not known); whether there was one."""
        runtime = self._runtime()
        found = runtime.find(trial_name(self._name))
        gone = {w for w in (workload, found.id if found is not None else None) if w is not None}
        for wid in gone:
            runtime.stop(wid, self._daemon.settings.stop_timeout_seconds)
            runtime.remove(wid)
        return bool(gone)

    def stop_old(self) -> OldStopped:
        """The switch. On the deployment's private socket the trial server is handed over: its socket takes the
        deployment's path (one rename: the gateway's next connection reaches it, the old server asleep or
        stopped behind it), and the deployment's worker stops the old server and adopts the trial's workload
        through the lifecycle's adoption (readiness as for any adopted server), with no second boot. On TCP
        (its port is the trial's own) the trial goes and the worker boots the new image (its compile cache
        filled by the trial, keyed by version inside vLLM)."""
        trial, workload = self._trial, self._trial_id
        if self._hand_over and isinstance(trial, UnixAddress) and workload is not None:
            server = backend_address(self._daemon.settings, self._name, self._dep)
            if isinstance(server, UnixAddress):
                try:
                    os.replace(trial.path, server.path)
                except OSError as exc:
                    log.warning("handover_refused", deployment=self._name, error=str(exc))
                else:
                    log.info("handover_socket", deployment=self._name, container_id=workload, socket=str(server.path))
                    self.handed_over = workload
                    return OldStopped()
        self.stop_trial(None)
        return OldStopped()

    def stop_new(self, workload: str | None) -> NewStopped:
        self.stop_trial(workload)
        return NewStopped()

    def restore_old(self, room: str | None) -> OldRestored:
        """The old server serves again: the upgrade's hold goes and the coordinator wakes it (asleep: woken; a
        daemon just started may first adopt it asleep; stopped: booted by its worker); returns once it is ready
        or its worker gave up."""
        coordinator, name = self._daemon.coordinator, self._name
        coordinator.release_upgrade(name)
        worker = self._worker()
        if worker is None:
            return OldRestored()  # taken down meanwhile: `up` boots it
        clock = self._daemon.fleet.clock
        asked = -LOOK_SECONDS

        def serving() -> bool:
            nonlocal asked
            stage = worker.machine.stage
            if stage is m.Stage.ASLEEP and clock.monotonic() - asked >= LOOK_SECONDS:
                asked = clock.monotonic()  # asked again while asleep: a worker of a daemon just started adopts first
                coordinator.wake(name, by="upgrade")
            return stage is m.Stage.READY or stage in m.TERMINAL or not worker.alive

        coordinator.wake(name, by="upgrade")
        coordinator.wait_until(serving, self._daemon.settings.boot_timeout_seconds)
        return OldRestored()
