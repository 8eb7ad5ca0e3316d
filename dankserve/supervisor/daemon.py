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
import random
import resource
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal

import structlog

from dankserve.backend_address import BackendAddress
from dankserve.control import ControlServer, socket_path
from dankserve.errors import DankserveError, EnvironmentUnusable
from dankserve.exitcodes import ExitCode
from dankserve.host.gpu_processes import held_bytes, stand_in_dir
from dankserve.host.model import GpuIdentity, Host
from dankserve.planning import backend_address
from dankserve.secret_files import read_key_now
from dankserve.settings import (
    DeploymentSettings,
    ReloadEffects,
    Settings,
    SettingsSource,
    as_source,
    resolve_config_path,
)
from dankserve.supervisor import instance
from dankserve.supervisor import machine as m
from dankserve.supervisor.clock import Clock, SystemClock
from dankserve.supervisor.control import requests
from dankserve.supervisor.control.reload_requests import ReloadRequests
from dankserve.supervisor.edges import Planner, RuntimeFactory, WeightsFetcher
from dankserve.supervisor.fit import check_fit
from dankserve.supervisor.fleet import swap, swap_verify
from dankserve.supervisor.fleet.coordinator import FleetCoordinator
from dankserve.supervisor.fleet.gpus import HostGpus
from dankserve.supervisor.machine import BootOverrides
from dankserve.supervisor.observe.status import config_status
from dankserve.supervisor.observe.telemetry import Telemetry
from dankserve.supervisor.ports import port_holder
from dankserve.supervisor.probes import sleep_mode
from dankserve.supervisor.probes.observatory import Observatory
from dankserve.supervisor.probes.warm_up import WarmUpOutcome, warm_up_server
from dankserve.supervisor.readiness import Readiness
from dankserve.supervisor.records import StateBook
from dankserve.supervisor.reloading import AdaptersInPlace, ConfigRefusal, ReloadOutcome
from dankserve.supervisor.upgrade.manager import Upgrades
from dankserve.supervisor.worker import DeploymentWorker, WorkerServices, adapters
from dankserve.supervisor.worker.fleet import Fleet, StatusReadings
from dankserve.systemd.notify import SystemdNotifier, watchdog_interval

if TYPE_CHECKING:
    from dankserve.gateway.usage import Counts

log = structlog.get_logger("dankserve")

HostLoader = Callable[[], Host]

__all__ = ["BootOverrides", "Daemon", "DaemonDeps", "DeploymentWorker", "Planner", "WeightsFetcher"]


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
class DaemonDeps:
    """The edges the daemon uses; in-process tests hand in a fake runtime and a fake clock."""

    planner: Planner
    runtime_for: RuntimeFactory
    load_host: HostLoader
    hardware_file: Path | None = None
    services: Callable[[Daemon], Callable[[], None]] | None = None
    """Started after the control socket (e.g. the cluster API); returns the function that stops it."""
    describe_hosts: Callable[[str], list[dict[str, Any]] | None] | None = None
    """The hosts of a multi-host deployment for `status` (None: a single-host one)."""
    follower_gpus: Callable[[str, DeploymentSettings, bool], Sequence[tuple[GpuIdentity, int]]] | None = None
    """A group's followers' GPUs (identity, free bytes now) for boot learning; with strict=True a follower that
    does not answer raises, otherwise it is left out (so learned bytes are not reused)."""
    clock: Clock = field(default_factory=SystemClock)
    fetch_weights: WeightsFetcher | None = None
    """Downloads a deployment's weights before its boot, reporting percent done (None: vLLM fetches them)."""
    check_port: Callable[[BackendAddress], str | None] = port_holder
    """Who listens on (host, port) already, or None when it is free."""
    health: Callable[[BackendAddress, float], m.HealthChecked] | None = None
    """/health of (address, timeout); None: the real HTTP probe."""
    warm_up: Callable[[BackendAddress, str, str | None, float], WarmUpOutcome] = warm_up_server
    """The warm-up before READY to (host, port, served model, API key, timeout): None, or what failed."""
    draw: Callable[[], float] = random.random
    """The uniform draw in [0, 1) behind the restart jitter."""
    # Swap groups (issue 16).
    sleep_server: Callable[[BackendAddress, str | None, m.SleepLevel], m.Event] = sleep_mode.sleep_server
    """Put the server on (host, port) with this API key to sleep at level 1 or 2."""
    wake_server: Callable[[BackendAddress, str | None, m.SleepLevel], m.Event] = sleep_mode.wake_server
    """Wake it (level 2: the staged wake with reload_weights)."""
    available_ram: Callable[[], int | None] = sleep_mode.available_ram_bytes
    """The host's available RAM now (level 1 pins the weights there)."""
    is_sleeping: Callable[[BackendAddress, str | None], bool | None] = sleep_mode.is_sleeping
    """Whether the server on (host, port) sleeps (None: no answer): a member an earlier daemon left running."""
    canary: swap_verify.Canary = swap_verify.canary_ids
    """The greedy token ids of the canary prompt from (host, port, key, model): every wake is checked by it."""
    gpu_held: swap_verify.HeldBytes | None = None
    """Bytes given pids hold on given GPUs (None: NVML, or the stand-in's records beside the hardware file)."""


class Daemon:
    """Supervises every enabled deployment until told to stop."""

    def __init__(self, settings: Settings | SettingsSource, deps: DaemonDeps, config_path: Path | None = None) -> None:
        self.source = as_source(settings)
        """The one holder of the running settings: every part of the daemon reads them through it."""
        settings = self.source.current()
        self._config_path = config_path
        self.deps = deps
        self.state = StateBook(settings.state_dir)
        self.notifier = SystemdNotifier.from_environ()
        self.host: Host = deps.load_host()
        self.gpus = HostGpus(self.host, deps.hardware_file)
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
        """Services' reads a reload needs (the gateway's key files): each reads what the new settings name
        and returns how to put it in force once the reload is accepted, or raises the user error that
        refuses the reload (set as the services start)."""
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
            clock=deps.clock,
            telemetry=self.telemetry,
            observatory=self.observatory,
            describe_hosts=deps.describe_hosts,
        )
        self.coordinator = FleetCoordinator(self.fleet, deps.available_ram, deps.clock)
        held = deps.gpu_held or (lambda pids, uuids: held_bytes(pids, uuids, stand_in_dir(deps.hardware_file)))
        self.swap_verifier = swap_verify.SwapVerifier(self.state, deps.canary, held)
        self._status_readings = StatusReadings(held, self.coordinator.idle_sleep_in)
        self.upgrades = Upgrades(self)
        self.source.replace(self.upgrades.settings_for(self.settings))  # an upgrade's image where one switched

    @property
    def settings(self) -> Settings:
        """The running settings now (`source.current()`)."""
        return self.source.current()

    def worker_services(self) -> WorkerServices:
        """What this daemon's workers are handed (the edges as `deps` says now)."""
        return WorkerServices(
            settings=lambda: self.settings,
            edges=self.deps,
            clock=self.deps.clock,
            state=self.state,
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
                console=None if self.settings.gateway else console_mount(self.handle_request, log_feed(self)),
            )
            if self.deps.services is not None:
                close_services = self.deps.services(self)
            starting = {n: d for n, d in self.settings.deployments.items() if d.enabled and not self.state.is_down(n)}
            self.coordinator.start()
            self.upgrades.recover_before_workers()  # an earlier daemon's trial server goes first
            starting = {n: self.settings.deployments[n] for n in starting}
            self.gpus.claim_running_boots(starting, self.deps.runtime_for, self.deps.planner, self.state)
            for name, dep in starting.items():
                self._start_worker(name, dep, unless_running=True)
            self.upgrades.resume_after_workers()
            if not self.fleet.snapshot():
                log.info("no_deployments", hint="configure [deployments.NAME] or `dankserve up NAME`")
            self._main_loop()
            return ExitCode.OK
        finally:
            self.notifier.stopping()
            close_metrics()  # first: the descriptors its peers hold are free for stopping the servers
            self.coordinator.close()
            self._stop_all()
            close_services()
            self.observatory.close()
            control.close()
            self.state.flush()
            held.release()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            log.info("daemon_stopped")

    def _stop_all(self) -> None:
        """Every worker stopped (`Fleet.stop_all`), and the idle launchers removed."""
        self.fleet.stop_all(self.settings.stop_timeout_seconds + 15, self.stop_failed, self.deps.runtime_for)

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
        check_fit(self.deps.planner, self.host, settings)

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
        now = time.time()
        read = _read_reload(self.settings, self._config_path, now, fit=self.check_fit, reads=self.reload_checks)
        if isinstance(read, ConfigRefusal):
            log.error("reload_rejected", error=read.error, fix=read.fix, keeping="the running configuration")
            self.config_refusal = read
            return ReloadOutcome(now, read)
        effects, uses = read
        self.config_refusal = None
        self.config_loaded_at = now
        effects = replace(effects, settings=self.upgrades.settings_for(effects.settings))  # a switched image
        old, new = self.settings, effects.settings
        self.source.accept(effects)
        for use in uses:
            use()
        if effects.needs_restart:
            log.warning("reload_needs_restart", keys=list(effects.needs_restart), keeping="their running values")
        restart, start, stop, keep = [], [], [], []  # deployment names, by what the reload does to each
        in_place: dict[str, AdaptersInPlace] = {}
        for name, worker in self.fleet.snapshot().items():
            dep = new.deployments.get(name)
            if dep is None or not dep.enabled:
                # Not waited for here: this thread sends WATCHDOG=1, and a stop may take stop_timeout_seconds.
                log.info("reload_stop", deployment=name)
                stop.append(name)
                self.fleet.retire(worker)
            elif dep != (before := old.deployments.get(name)):
                if before is not None and (change := _in_place(name, worker, before, dep, new)) is not None:
                    worker.use_settings(dep)  # only adapters changed: loaded and unloaded, the server kept
                    keep.append(name)
                    in_place[name] = change
                    continue
                if worker.alive and before is not None and swap.server_unchanged(before, dep):
                    # Only what the swap coordinator reads changed (it reads the new settings): the
                    # server, awake or asleep, stays as it is.
                    log.info("reload_swap_settings", deployment=name, server="unchanged")
                    worker.use_settings(dep)
                    keep.append(name)
                    continue
                log.info("reload_replan", deployment=name)
                if worker.alive:
                    restart.append(name)
                    worker.request_replan(dep)
                else:
                    start.append(name)
                    self._start_worker(name, dep)
            else:
                keep.append(name)
        running = self.fleet.snapshot()
        groups = [new.deployments[n].swap_group for n, w in running.items() if w.alive and n in new.deployments]
        for name, dep in new.deployments.items():
            if name not in running and dep.enabled and not self.state.is_down(name):
                asleep = swap.joins_asleep(dep.swap_group, groups)
                log.info("reload_start", deployment=name, joins_asleep=asleep)
                start.append(name)
                self._start_worker(name, dep, join_asleep=asleep)
        log.info("reload_accepted", restart=restart, start=start, stop=stop, keep=keep, applied=list(effects.applied))
        lists = (tuple(restart), tuple(start), tuple(stop), tuple(keep), effects.applied, effects.needs_restart)
        return ReloadOutcome(now, None, *lists, adapters=in_place)

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
        path = str(resolve_config_path(self._config_path)[0].absolute())
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


def _in_place(
    name: str, worker: DeploymentWorker, before: DeploymentSettings, dep: DeploymentSettings, settings: Settings
) -> AdaptersInPlace | None:
    """The adapters a reload loaded and unloaded in `name`'s ready server; None: it restarts instead."""
    change = adapters.reload_in_place(
        name,
        before,
        dep,
        ready=worker.alive and worker.machine.stage is m.Stage.READY,
        hf_cache_dir=settings.hf_cache_dir,
        address=backend_address(settings, name, dep),
        api_key=read_key_now(dep.api_key_file),
    )
    return None if change is None else AdaptersInPlace.of(tuple(change.load), change.unload)
