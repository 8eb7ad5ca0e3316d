"""The daemon: wiring and the main loop. It builds the fleet of deployment workers (`fleet.Fleet`, each
worker an interpreter of the pure lifecycle machine: `worker/`), the swap groups, the observatory and
the control socket, then runs until told to stop.

Every decision (adopt or replace, reuse learned bytes, ready or not, restart or give up) is the
machine's; a worker reaches the world only through its `WorkerServices`. The main thread handles
signals (SIGTERM/SIGINT stop, SIGHUP reload), reloads and systemd notifications (the main loop,
`readiness.Readiness`); the control socket is served on its own thread (`control.ControlServer`),
which hands each request to `Daemon.handle_request` (`requests`' verb table).
"""

from __future__ import annotations

import os
import resource
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal

import structlog

from dankserve.control import ControlServer, socket_path
from dankserve.errors import DankserveError, EnvironmentUnusable
from dankserve.exitcodes import ExitCode
from dankserve.host.model import Host
from dankserve.settings import (
    DeploymentSettings,
    ReloadEffects,
    Settings,
    resolve_config_path,
)
from dankserve.snapshot.gpu_helper import unavailable as gpu_unavailable
from dankserve.supervisor import instance
from dankserve.supervisor import machine as m
from dankserve.supervisor.control import requests
from dankserve.supervisor.control.reload_plan import DeploymentNow, plan_reload
from dankserve.supervisor.control.reload_requests import ReloadRequests
from dankserve.supervisor.control.reload_run import carry_out
from dankserve.supervisor.edges import Planner, WeightsFetcher
from dankserve.supervisor.fit import check_fit
from dankserve.supervisor.fleet import swap_verify
from dankserve.supervisor.fleet.coordinator import FleetCoordinator
from dankserve.supervisor.fleet.gpus import HostGpus
from dankserve.supervisor.fleet.swap_suspend import SuspendReadings
from dankserve.supervisor.machine import BootOverrides
from dankserve.supervisor.observe.status import config_status
from dankserve.supervisor.observe.telemetry import Telemetry
from dankserve.supervisor.probes.observatory import Observatory
from dankserve.supervisor.readiness import Readiness
from dankserve.supervisor.reloading import ConfigRefusal, ReloadOutcome
from dankserve.supervisor.upgrade.edge import UpgradeFleet
from dankserve.supervisor.upgrade.manager import Upgrades
from dankserve.supervisor.worker import DeploymentWorker, WorkerServices
from dankserve.supervisor.worker.fleet import Fleet, StatusReadings
from dankserve.supervisor.world import World
from dankserve.systemd.notify import SystemdNotifier, watchdog_interval

if TYPE_CHECKING:
    from dankserve.gateway.usage import Counts

log = structlog.get_logger("dankserve")

__all__ = [
    "BootOverrides",
    "Daemon",
    "DaemonParts",
    "DeploymentWorker",
    "Planner",
    "Services",
    "WeightsFetcher",
    "World",
]


def raise_descriptor_limit() -> None:
    """The soft RLIMIT_NOFILE raised to the hard limit: the unit sets LimitNOFILE, a shell's 1024 is
    too few for the servers, Podman calls, probes and peers of a busy daemon."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as exc:
        log.warning("descriptor_limit_kept", soft=soft, hard=hard, error=str(exc))
        return
    log.info("descriptor_limit_raised", soft=soft, to=target)


SLOW_STOP_STEP_SECONDS = 3.0
"""A step of the daemon's stop taking longer is logged (`daemon_stop_slow`): what held SIGTERM up."""


def _stop_in_order(*steps: tuple[str, Callable[[], None]]) -> None:
    for step, close in steps:
        began = time.monotonic()
        close()
        took = time.monotonic() - began
        if took >= SLOW_STOP_STEP_SECONDS:
            log.warning("daemon_stop_slow", step=step, seconds=round(took, 1))


def install_signals(stop: Callable[[], None], reload: Callable[[], None]) -> dict[int, Any]:
    """SIGTERM and SIGINT stop, SIGHUP reloads (only on the main thread); the handlers they replace."""
    previous: dict[int, Any] = {}
    if threading.current_thread() is not threading.main_thread():
        return previous

    def on_stop(signum: int, frame: FrameType | None) -> None:
        stop()

    def on_hup(signum: int, frame: FrameType | None) -> None:
        reload()

    for sig, handler in ((signal.SIGTERM, on_stop), (signal.SIGINT, on_stop), (signal.SIGHUP, on_hup)):
        previous[sig] = signal.signal(sig, handler)
    return previous


@dataclass(frozen=True)
class DaemonParts:
    """What the services started beside the daemon (the cluster API, the gateway) use of it: never the daemon."""

    world: World
    gpus: HostGpus
    fleet: Fleet
    coordinator: FleetCoordinator
    upgrades: Upgrades
    answer: Callable[[Mapping[str, Any]], dict[str, Any]]
    """A control request's answer (what the control socket answers; the web console asks it)."""


@dataclass(frozen=True)
class Services:
    """What the services started beside the daemon hand back."""

    close: Callable[[], None]
    """Stops them."""
    gateway_usage: Callable[[], Mapping[tuple[str, str], Counts]] | None = None
    """The gateway's requests and tokens per key (/metrics), when a gateway runs."""
    reload_check: Callable[[Settings], Callable[[], None]] | None = None
    """A read a reload needs (the gateway's key files): reads what the new settings name and returns how to put
    it in force once the reload is accepted, or raises the user error that refuses the reload."""


ServiceStarter = Callable[[DaemonParts], Services]
"""Started after the control socket (`assembly.start_services`)."""


class Daemon:
    """Supervises every enabled deployment until told to stop."""

    def __init__(self, world: World, services: ServiceStarter | None = None) -> None:
        self.world = world
        """What the daemon reaches, built once (`assembly.build_world`)."""
        self.source = world.source
        """The one holder of the running settings: every part of the daemon reads them through it."""
        settings = self.source.current()
        self._services = services
        self.state = world.state
        self.notifier = SystemdNotifier.from_environ()
        self.host: Host = world.host
        self.gpus = HostGpus(self.host, world.gpus)
        self._stops_failed: set[str] = set()
        """Deployments whose server a stop could not reach (run exits 3 then)."""
        self._stops_lock = threading.Lock()
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._reloads = ReloadRequests()
        self.config_loaded_at = time.time()
        """When the running settings were read: at start (just before), then at each accepted reload."""
        self.config_refusal: ConfigRefusal | None = None
        """The last reload's refusal (the running config stayed), None once a reload is accepted."""
        self.gateway_usage: Callable[[], Mapping[tuple[str, str], Counts]] = dict  # set once the gateway runs
        self.reload_checks: list[Callable[[Settings], Callable[[], None]]] = []
        """Services' reads a reload needs (`Services.reload_check`), set as the services start."""
        self.telemetry = Telemetry()
        self.observatory = Observatory(
            targets=lambda: self.fleet.serving_targets(),  # noqa: PLW0108 (the fleet is made next, with it)
            read_gpus=self.gpus.all_memory,
            telemetry=self.telemetry,
            interval=settings.serving_scrape_interval_seconds,
            preemption_interval=settings.preemption_warning_interval_seconds,
        )
        self.fleet = Fleet(
            lambda: self.settings,
            self.state,
            clock=world.clock,
            telemetry=self.telemetry,
            observatory=self.observatory,
            describe_hosts=world.cluster.describe_hosts,
        )
        self.coordinator = FleetCoordinator(self.fleet, world.available_ram, world.clock, self._suspend_readings())
        self.swap_verifier = swap_verify.SwapVerifier(self.state, world.servers.canary, world.gpus.held)
        self._status_readings = StatusReadings(world.gpus.held, self.coordinator.idle_sleep_in)
        self.upgrades = Upgrades(UpgradeFleet(world, self.fleet, self.coordinator, self.gpus))

    def _suspend_readings(self) -> SuspendReadings:
        """What the coordinator's choice of a suspended sleep reads (issue 41 item 7): the checkpoint edge's
        availability, each GPU's size, and what a member's server holds on its GPUs now."""
        world = self.world

        def held(name: str) -> Mapping[str, int] | None:
            worker = self.fleet.snapshot().get(name)
            if worker is None or not worker.machine.gpu_uuids:
                return None
            return world.gpus.held(worker.server_pids(), worker.machine.gpu_uuids)

        def totals(uuids: Sequence[str]) -> Mapping[str, int]:
            return {uuid: reading.total_bytes for uuid, reading in world.gpus.memory(uuids).items()}

        def unavailable() -> str | None:  # known before any action, without loading CUDA into the daemon
            missing = gpu_unavailable(world.gpu_checkpoint())
            return None if missing is None else f"{missing.reason}: {missing.fix}"

        return SuspendReadings(unavailable, totals, held)

    @property
    def settings(self) -> Settings:
        """The running settings now (`source.current()`)."""
        return self.source.current()

    def worker_services(self) -> WorkerServices:
        """What this daemon's workers are handed (the world as `world` says now)."""
        return WorkerServices(
            world=self.world,
            telemetry=self.telemetry,
            observatory=self.observatory,
            gpus=self.gpus,
            swaps=self.coordinator,
            phase_changed=self.phase_changed,
            stop_failed=self.stop_failed,
            swap_verifier=self.swap_verifier,
        )

    def phase_changed(self) -> None:
        self._changed.set()
        self.coordinator.poke()

    def stop_failed(self, name: str) -> None:
        """A worker could not stop its server (the daemon out of descriptors or memory throughout)."""
        with self._stops_lock:
            self._stops_failed.add(name)

    # -- lifecycle ---------------------------------------------------------------------------
    def run(self) -> ExitCode:
        """Run until SIGTERM/SIGINT; the exit code for the process (3 when a server could not be stopped)."""
        code = self._run()
        if self._stops_failed and code is ExitCode.OK:
            log.error("servers_left_running", deployments=sorted(self._stops_failed))
            return ExitCode.ENVIRONMENT
        return code

    def _run(self) -> ExitCode:
        from dankserve.supervisor.control.metrics_service import (
            console_mount,
            log_feed,
            metrics_snapshot,
            start_metrics,
        )

        held = instance.acquire(self.settings.state_dir)
        raise_descriptor_limit()
        control = ControlServer(socket_path(self.settings.state_dir), self.handle_request)
        previous = install_signals(self.request_stop, self.request_reload)
        close_services: Callable[[], None] = lambda: None  # noqa: E731
        close_metrics: Callable[[], None] = lambda: None  # noqa: E731
        try:
            try:
                control.start()
            except OSError as exc:
                raise EnvironmentUnusable(
                    f"cannot listen on the control socket {control.path}: {exc.strerror or exc}",
                    fix="make the state dir writable (the state_dir setting or DANKSERVE_STATE_DIR names it)",
                ) from None
            self.observatory.start()
            close_metrics = start_metrics(
                self.settings,
                lambda: metrics_snapshot(self.fleet, self.telemetry, self.observatory, self.gateway_usage),
                # without a gateway the console is served beside /metrics (the gateway's listener has it otherwise)
                console=None if self.settings.gateway else console_mount(self.handle_request, log_feed(self.world)),
            )
            if self._services is not None:
                close_services = self._start_services(self._services)
            starting = {n: d for n, d in self.settings.deployments.items() if d.enabled and not self.state.is_down(n)}
            self.coordinator.start()
            self.upgrades.recover_before_workers()  # an earlier daemon's trial server goes first
            starting = {n: self.settings.deployments[n] for n in starting}
            self.gpus.claim_running_boots(starting, self.world.runtime_for, self.world.planner, self.state)
            for name, dep in starting.items():
                self._start_worker(name, dep, unless_running=True)
            self.upgrades.resume_after_workers()
            if not self.fleet.snapshot():
                log.info("no_deployments", hint="configure [deployments.NAME] or `dankserve up NAME`")
            self._main_loop()
            return ExitCode.OK
        finally:
            self.notifier.stopping()
            _stop_in_order(
                ("metrics", close_metrics),  # first: the descriptors its peers hold are free for stopping the servers
                ("coordinator", self.coordinator.close),
                ("deployments", self._stop_all),
                ("services", close_services),
                ("observatory", self.observatory.close),
                ("control socket", control.close),
                ("state", self.state.flush),
            )
            held.release()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            log.info("daemon_stopped")

    def _start_services(self, start: ServiceStarter) -> Callable[[], None]:
        """The services beside the daemon, handed the parts they use; the function that stops them."""
        parts = DaemonParts(self.world, self.gpus, self.fleet, self.coordinator, self.upgrades, self.handle_request)
        started = start(parts)
        if started.gateway_usage is not None:
            self.gateway_usage = started.gateway_usage
        if started.reload_check is not None:
            self.reload_checks.append(started.reload_check)
        return started.close

    def _stop_all(self) -> None:
        """Every worker stopped (`Fleet.stop_all`), and the idle launchers removed."""
        self.fleet.stop_all(self.settings.stop_timeout_seconds + 15, self.stop_failed, self.world.runtime_for)

    def _start_worker(
        self, name: str, dep: DeploymentSettings, *, join_asleep: bool = False, unless_running: bool = False
    ) -> None:
        """A worker for the deployment (`Fleet.add`)."""
        worker = DeploymentWorker(name, dep, self.worker_services(), join_asleep=join_asleep)
        self.fleet.add(worker, unless_running=unless_running)

    def _main_loop(self) -> None:
        readiness = Readiness(self.notifier, watchdog_interval())
        while not self._stop.is_set():
            self._changed.wait(readiness.wait_seconds(time.monotonic()))
            self._changed.clear()
            if self._reload.is_set():
                self._reload.clear()
                asked = self._reloads.asked()  # read before the file is: these requests are answered by it
                outcome = self._apply_reload()
                self._reloads.answered(asked, outcome)
            self.fleet.reap()
            readiness.report(self.fleet.snapshot(), time.monotonic())

    def request_stop(self) -> None:
        self._stop.set()
        self._changed.set()

    def check_fit(self, settings: Settings) -> None:
        """Plan every enabled deployment of `settings` and check they fit together (`fit.check_fit`); raises
        the user error. At start (preflight) and before a reload takes effect."""
        check_fit(self.world.planner, self.host, settings, self.state.as_run)

    # -- reloads -----------------------------------------------------------------------------
    def request_reload(self) -> None:
        """Reload at the main loop's next turn (SIGHUP: the handler must not wait)."""
        self._reload.set()
        self._changed.set()

    def reload_and_wait(self, timeout: float) -> ReloadOutcome | None:
        """Ask for a reload that reads the file after now and wait for its outcome (None: not done in time)."""
        mine = self._reloads.ask()
        self.request_reload()
        return self._reloads.wait(mine, timeout)

    def _apply_reload(self) -> ReloadOutcome:
        """Read the file, plan the reload (`control.reload_plan.plan_reload`, pure) and carry the plan out."""
        now = time.time()
        read = _read_reload(self.settings, self.world.config_path, now, fit=self.check_fit, reads=self.reload_checks)
        if not isinstance(read, ConfigRefusal):
            effects, uses = read
            views = self._reload_views()
            down = [n for n in effects.settings.deployments if n not in views and self.state.is_down(n)]
            plan = plan_reload(self.settings, effects, views, down)
            if plan.refusal is not None:
                read = ConfigRefusal(now, plan.refusal, plan.refusal_fix)
        if isinstance(read, ConfigRefusal):
            log.error("reload_rejected", error=read.error, fix=read.fix, keeping="the running configuration")
            self.config_refusal = read
            return ReloadOutcome(now, read)
        self.config_refusal = None
        self.config_loaded_at = now
        self.source.accept(effects)
        for use in uses:
            use()
        if effects.needs_restart:
            log.warning("reload_needs_restart", keys=list(effects.needs_restart), keeping="their running values")
        return carry_out(plan, now, self.settings, fleet=self.fleet, state=self.state, start=self._start_worker)

    def _reload_views(self) -> dict[str, DeploymentNow]:
        """What a reload's plan reads of each supervised deployment."""
        return {
            name: DeploymentNow(
                alive=worker.alive,
                ready=worker.alive and worker.machine.stage is m.Stage.READY,
                upgrading=self.upgrades.current(name) is not None,
                upgrade=self.state.deployment(name).upgrade,
            )
            for name, worker in self.fleet.snapshot().items()
        }

    # -- control requests --------------------------------------------------------------------
    def handle_request(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """A control request's answer (`supervisor.control.requests`' verb table)."""
        return requests.answer(self, request)

    def take_down(self, name: str) -> None:
        """`dankserve down NAME`: remembered as down; returns once its worker stopped."""
        worker = self.fleet.take_down(name)
        if worker is not None:  # waited for (the CLI's `down` returns once stopped), outside the lock
            worker.request_stop(keep_launcher=True)
            worker.join(self.settings.stop_timeout_seconds + 15)

    def bring_up(self, name: str) -> None:
        """`dankserve up NAME`: no longer down; its worker started unless one runs."""
        dep = self.settings.deployments[name]
        self.fleet.bring_up(name, lambda: DeploymentWorker(name, dep, self.worker_services()))

    def restart(self, name: str) -> None:
        """`dankserve restart NAME`: one request, its old worker stopped and a new one started; the gateway
        queues the deployment's requests meanwhile (never the 503 of a deployment taken down)."""
        worker = self.fleet.leave_for_restart(name)
        try:
            if worker is not None:
                worker.request_stop(keep_launcher=True)
                worker.join(self.settings.stop_timeout_seconds + 15)
        finally:
            dep = self.settings.deployments[name]
            self.fleet.restarted(name, lambda: DeploymentWorker(name, dep, self.worker_services()))

    def swap_and_wait(self, verb: Literal["sleep", "wake"], name: str) -> dict[str, Any]:
        """`dankserve sleep NAME` / `dankserve wake NAME`: answered once asleep or ready (or given up)."""
        return requests.sleep_or_wake(self.fleet, self.coordinator, verb, name)

    def status(self) -> dict[str, Any]:
        """The `status --json` document while the daemon runs."""
        deployments = [view.to_json() for view in self.fleet.views(readings=self._status_readings)]
        path = str(resolve_config_path(self.world.config_path)[0].absolute())
        daemon: dict[str, Any] = {
            "running": True,
            "pid": os.getpid(),
            "config": config_status(path, self.config_loaded_at, self.config_refusal, self.source.needs_restart()),
        }
        swaps = self.telemetry.swaps.newest_first()
        return {"daemon": daemon, "deployments": deployments, "swaps": swaps, "warnings": []}


def _read_reload(
    running: Settings,
    config_path: Path | None,
    now: float,
    *,
    fit: Callable[[Settings], None],
    reads: Sequence[Callable[[Settings], Callable[[], None]]],
) -> tuple[ReloadEffects, list[Callable[[], None]]] | ConfigRefusal:
    """The config file's effect on the running settings, checked like a start (`fit`), and the services' reads
    to put in force with it (`Daemon.reload_checks`); or why it is refused."""
    from dankserve.settings import load_reload

    try:
        new = load_reload(running, config_path)
        fit(new.settings)
        uses = [read(new.settings) for read in reads]
    except Exception as exc:  # any failure keeps the running config and deployments
        if isinstance(exc, DankserveError):
            return ConfigRefusal(now, exc.message, exc.fix)
        return ConfigRefusal(now, f"internal error: {type(exc).__name__}: {exc}", None)
    return new, uses
