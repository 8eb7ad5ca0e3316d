"""The daemon: one worker thread per deployment, each a small interpreter over the pure lifecycle
machine (`supervisor.machine`), talking to the world through the runtime, the state store, NVML
readings, sd_notify and the control socket.

A worker feeds events into `machine.step` and runs the commands it returns: planning, pulling,
starting and stopping workloads, following their logs, probing /health, recording boots and
failures. Every decision (adopt or replace, reuse learned bytes, ready or not, restart or give
up) is the machine's. The main thread handles signals (SIGTERM/SIGINT stop, SIGHUP reload),
reloads and systemd notifications (the main loop); the control socket is served on its own
thread (`control.ControlServer`), which hands each request to `Daemon.handle_request`.
"""

from __future__ import annotations

import queue
import random
import resource
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal

import structlog

from dankserve.bootlog import BootLogReader, PhaseChanged
from dankserve.control import ControlServer, socket_path
from dankserve.errors import (
    DankserveError,
    EnvironmentUnusable,
    HubUnreachable,
    resources_exhausted,
)
from dankserve.exitcodes import ExitCode
from dankserve.host.gpu_memory import GpuMemory, read_gpu_memory, read_nvml, wait_dead_processes_released
from dankserve.host.model import GpuIdentity, Host
from dankserve.plan.plan import has_sleep_mode
from dankserve.plan.types import Plan
from dankserve.planning import compile_cache_dir
from dankserve.runtime.base import Runtime
from dankserve.secret_files import read_key_now
from dankserve.settings import DeploymentSettings, Settings
from dankserve.supervisor import instance, launching, learning, prediction, requests, sleep_mode, swap
from dankserve.supervisor import machine as m
from dankserve.supervisor.clock import Clock, SystemClock
from dankserve.supervisor.gpu_slots import BootSlot, GpuBootLocks
from dankserve.supervisor.health import check_health
from dankserve.supervisor.lifecycle import BOOTING_PHASES, Phase, all_settled, status_line
from dankserve.supervisor.liveness import LivenessSettings
from dankserve.supervisor.liveness_probe import LivenessMonitor, served_model_name
from dankserve.supervisor.log_pump import Inbox, Line, LogPump
from dankserve.supervisor.machine import BootOverrides
from dankserve.supervisor.observatory import Observatory, ServingTarget
from dankserve.supervisor.policy import FailureCause, RestartSettings
from dankserve.supervisor.ports import port_holder
from dankserve.supervisor.records import StateBook
from dankserve.supervisor.reloading import ConfigRefusal, ReloadOutcome
from dankserve.supervisor.status import DeploymentView, Metrics, config_status, deployment_view
from dankserve.supervisor.swap_groups import PlanFacts, SwapGroups
from dankserve.supervisor.telemetry import Telemetry, boot_kind
from dankserve.supervisor.warm_up import warm_up_server
from dankserve.supervisor.workload import launcher_run_dir, workload_spec
from dankserve.systemd.notify import SystemdNotifier, watchdog_interval

if TYPE_CHECKING:
    from dankserve.supervisor.metrics import MetricsSnapshot

log = structlog.get_logger("dankserve")

Planner = Callable[[str, DeploymentSettings, Host, BootOverrides, str | None], Plan]
RuntimeFactory = Callable[[DeploymentSettings], Runtime]
HostLoader = Callable[[], Host]
WeightsFetcher = Callable[[str, DeploymentSettings, Callable[[int], None]], "m.WeightsFailed | None"]
"""fetch(name, dep, progress) -> None when the weights are in place, or WeightsFailed (permanent or not)."""

__all__ = ["BootOverrides", "Daemon", "DaemonDeps", "DeploymentWorker", "Planner"]


STOP_COMMANDS = (m.StopWorkload, m.RemoveWorkload, m.StopServer, m.RemoveLauncher)
STOP_RETRY_SECONDS = 10.0
"""How long a stop refused for the daemon's own want of descriptors or memory is tried again."""
STOP_RETRY_PAUSE_SECONDS = 0.2


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
    check_port: Callable[[str, int], str | None] = port_holder
    """Who listens on (host, port) already, or None when it is free."""
    health: Callable[[str, int, float], m.HealthChecked] | None = None
    """/health of (host, port, timeout); None: the real HTTP probe."""
    warm_up: Callable[[str, int, str, str | None, float], str | None] = warm_up_server
    """The warm-up before READY to (host, port, served model, API key, timeout): None, or what failed."""
    draw: Callable[[], float] = random.random
    """The uniform draw in [0, 1) behind the restart jitter."""
    # Swap groups (issue 16).
    sleep_server: Callable[[str, int, str | None, m.SleepLevel], m.Event] = sleep_mode.sleep_server
    """Put the server on (host, port) with this API key to sleep at level 1 or 2."""
    wake_server: Callable[[str, int, str | None, m.SleepLevel], m.Event] = sleep_mode.wake_server
    """Wake it (level 2: the staged wake with reload_weights)."""
    available_ram: Callable[[], int | None] = sleep_mode.available_ram_bytes
    """The host's available RAM now (level 1 pins the weights there)."""
    is_sleeping: Callable[[str, int, str | None], bool | None] = sleep_mode.is_sleeping
    """Whether the server on (host, port) sleeps (None: no answer): a member an earlier daemon left running."""


def machine_config(settings: Settings, dep: DeploymentSettings, *, download_weights: bool = False) -> m.MachineConfig:
    """The machine's view of the settings of one deployment."""
    return m.MachineConfig(
        restart=RestartSettings.from_settings(settings),
        boot_timeout_seconds=settings.boot_timeout_seconds,
        health_interval_seconds=settings.health_interval_seconds,
        gpu_memory_settle_seconds=settings.gpu_memory_settle_seconds,
        max_model_len_setting=dep.max_model_len,
        gpu_memory_utilization_setting=dep.gpu_memory_utilization,
        download_weights=download_weights,
    )


class DeploymentWorker:
    """Keeps one deployment serving, in its own thread: an interpreter of the lifecycle machine."""

    def __init__(self, name: str, dep: DeploymentSettings, daemon: Daemon, *, join_asleep: bool = False) -> None:
        self.name = name
        self._join_asleep = join_asleep  # a swap member added by a reload to a running group: no first boot
        self.dep = dep
        self.daemon = daemon
        self.lock = threading.Lock()
        self.clock = daemon.deps.clock
        remembered = daemon.state.deployment(name)
        remediated = frozenset(FailureCause(c) for c in remembered.remediated if c in FailureCause._value2member_map_)
        self._machine = m.initial_state(
            self._config(dep), overrides=BootOverrides.from_remediation(remembered.overrides), remediated=remediated
        )
        self._inbox: Inbox = queue.Queue()
        self._stepping = threading.Lock()
        self._stopping = threading.Event()
        self._keep_launcher = False  # the stop asked for keeps the launcher (`down`)
        self._thread = threading.Thread(target=self._run, name=f"deployment-{name}", daemon=True)
        self.log = log.bind(deployment=name)
        self._slot: BootSlot | None = None
        self._reader = BootLogReader()
        self._fed = 0  # lines of the current workload's log read so far (a resumed stream skips them)
        self._follower = 0  # the current log follower's number: lines of older ones are dropped
        self._following: str | None = None
        self._alive: LivenessMonitor | None = None  # beyond /health, while ready
        self._last_cause: str | None = None  # the failure a RecordRestart that follows restarts after
        daemon.telemetry.track(name)
        self._runtimes: dict[str, Runtime] = {}
        """The runtime of each workload seen: a reload may change the deployment's runtime, never an old workload's."""
        self._waiting: str | None = None
        self._phase_since = self.clock.monotonic()

    def _config(self, dep: DeploymentSettings) -> m.MachineConfig:
        return machine_config(self.daemon.settings, dep, download_weights=self.daemon.deps.fetch_weights is not None)

    # -- control (any thread) ------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def request_stop(self, *, keep_launcher: bool = False) -> None:
        """Stop; `keep_launcher` (`dankserve down`): a launcher stays for the next `up`, only its server stops."""
        self._keep_launcher = keep_launcher
        self._stopping.set()
        self._inbox.put(m.StopRequested(keep_launcher=keep_launcher))

    def use_settings(self, dep: DeploymentSettings) -> None:
        """Settings that plan the same server (`swap.server_unchanged`): kept for the next boot, nothing restarts."""
        with self.lock:
            self.dep = dep

    def request_replan(self, dep: DeploymentSettings) -> None:
        """Apply a changed configuration: the next boot uses it."""
        with self.lock:
            self.dep = dep
        self._inbox.put(m.Reconfigured(self._config(dep), swap_member=dep.swap_group is not None))

    def feed(self, event: m.Event) -> None:
        """Hand the worker an event from outside (a liveness probe, a group monitor, a downloader)."""
        self._inbox.put(event)

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def machine(self) -> m.MachineState:
        with self.lock:
            return self._machine

    @property
    def phase(self) -> Phase:
        return self.machine.phase

    def booting_for(self) -> float | None:
        """Seconds the current boot has run, or None when not booting."""
        state = self.machine
        if state.phase in BOOTING_PHASES and state.boot is not None:
            return self.clock.monotonic() - state.boot.started_at
        return None

    # -- the interpreter ---------------------------------------------------------------------------
    def _run(self) -> None:
        self._feed(m.Begin(asleep=self._join_asleep))
        while self.machine.stage not in m.TERMINAL:
            state = self.machine
            timeout = None if state.wake_at is None else max(0.0, state.wake_at - self.clock.monotonic())
            item = self.clock.wait(self._inbox, timeout)
            if item is None:
                self._feed(m.Tick())
            elif isinstance(item, Line):
                self._on_line(item)
            else:
                self._feed(item)
            self._watch_liveness()
        self._release()

    def _watch_liveness(self) -> None:
        """While ready: the liveness checks beyond /health; a hung engine is fed as LivenessFailed."""
        state = self.machine
        if state.stage is not m.Stage.READY or state.boot is None:
            self._alive = None
            return
        now = self.clock.monotonic()
        if self._alive is None or self._alive.workload_id != state.boot.workload_id:
            self._alive = self._liveness_monitor(state.boot.workload_id, now)
        evidence = self._alive.step(now)
        if evidence is not None:
            self._alive = None
            self.log.warning("engine_hung", evidence=evidence)
            self._feed(m.LivenessFailed(FailureCause.ENGINE_HUNG, evidence))

    def _liveness_monitor(self, workload_id: str | None, now: float) -> LivenessMonitor:
        daemon = self.daemon
        settings = daemon.settings
        with self.lock:
            dep = self.dep
        return LivenessMonitor(
            name=self.name,
            workload_id=workload_id,
            host=dep.host,
            port=dep.port,
            model=served_model_name(tuple(dep.extra_args), dep.model),  # the planner never renames it
            api_key_file=dep.api_key_file,
            settings=LivenessSettings(settings.stall_seconds, settings.liveness_interval_seconds),
            timeout=settings.liveness_timeout_seconds,
            sample=lambda: daemon.observatory.sample(self.name),
            telemetry=daemon.telemetry,
            now=now,
            wall=self.clock.time,
        )

    def _on_line(self, item: Line) -> None:
        if item.follower != self._follower:
            return  # a follower of an earlier workload, or of a stream opened again
        if item.text is None:
            self._feed(m.LogEnded())
            return
        self._fed += 1
        before = self._reader.facts
        phases = [Phase(e.phase.value) for e in self._reader.feed(item.text) if isinstance(e, PhaseChanged)]
        facts = self._reader.facts
        for phase in phases:
            self._feed(m.BootLog(facts, phase))
        if not phases and facts != before:  # a fact without a phase change (the version, a failure ...)
            self._feed(m.BootLog(facts))

    def _feed(self, event: m.Event) -> None:
        """Step the machine with `event`, run its commands; a command's answer is stepped next."""
        pending: deque[m.Event] = deque([event])
        while pending:
            with self._stepping:  # a downloader's progress callback may step from its own thread
                before = self._machine
                after, commands = m.step(before, pending.popleft(), self.clock.monotonic())
                # Logs and records of the transition come first: once status shows the new state,
                # its log line and its state-file record are there too.
                instant = 0
                while instant < len(commands) and isinstance(commands[instant], _INSTANT):
                    instant += 1
                answer = self._run_batch(commands[:instant])
                self._publish(before, after)
            if answer is None:
                answer = self._run_batch(commands[instant:])
            if answer is not None:
                pending.append(answer)

    def _run_batch(self, commands: Sequence[m.Command]) -> m.Event | None:
        """Run commands in order until one answers; the rest of the batch was for a world that answer changed."""
        for command in commands:
            answer = self._execute(command)
            if answer is not None:
                return answer
        return None

    def _publish(self, before: m.MachineState, after: m.MachineState) -> None:
        done = after.swap  # a swap's timing is recorded before status shows its end
        ended = (done.last_at, done.last_kind) != (before.swap.last_at, before.swap.last_kind)
        if ended and done.last_kind is not None:
            took = done.last_sleep_seconds if done.last_kind == "sleep" else done.last_wake_seconds
            if took is not None:
                self.daemon.telemetry.swapped(self.name, done.last_kind, took)
                self._timed(done.last_kind, took)
        record = after.sleep_record
        if record != before.sleep_record:  # written before status shows it (and /sleep is sent), to outlive a kill -9
            self.daemon.state.set_asleep(
                self.name, record.level if record is not None else None, record.moving if record is not None else None
            )
        with self.lock:
            self._machine = after
            if after.phase is not before.phase:
                self._phase_since = self.clock.monotonic()
        if after.phase is not before.phase:
            self.log.info("phase", phase=after.phase.value)
            self.daemon.phase_changed()

    def _execute(self, command: m.Command) -> m.Event | None:
        """The command's answer; a stop the daemon's own EMFILE/ENOMEM stops is tried again (a lost stop
        leaves the server outliving the daemon), and one that never gets through is reported."""
        deadline = time.monotonic() + STOP_RETRY_SECONDS
        while True:
            event = self._execute_once(command)
            stopping = isinstance(command, STOP_COMMANDS)
            if not (stopping and isinstance(event, m.RuntimeUnreachable) and event.own_resources):
                return event
            if time.monotonic() >= deadline:
                self.log.error("stop_failed", error=event.message, command=type(command).__name__)
                self.daemon.stop_failed(self.name)
                return event
            time.sleep(STOP_RETRY_PAUSE_SECONDS)

    def _execute_once(self, command: m.Command) -> m.Event | None:
        try:
            return self._run_command(command)
        except Exception as exc:
            if isinstance(exc, DankserveError) and exc.transient:  # Podman, the Hub or a group not answering now
                return m.RuntimeUnreachable(exc.message, time.strftime("%H:%M:%S", time.localtime(self.clock.time())))
            own = resources_exhausted(exc)
            if own is not None:  # the daemon's own EMFILE/ENOMEM: never the deployment's fault, retried like an outage
                self.log.warning("daemon_resources_exhausted", error=own.message)
                clock_text = time.strftime("%H:%M:%S", time.localtime(self.clock.time()))
                return m.RuntimeUnreachable(own.message, clock_text, own_resources=True)
            if isinstance(exc, DankserveError):
                return m.Refused(exc.render())
            self.log.exception("cycle_error")  # a bug or an error of no known kind: the policy restarts with backoff
            return m.Crashed(f"{type(exc).__name__}: {exc}")

    def _probe_health(self, dep: DeploymentSettings, timeout: float) -> m.Event | None:
        """/health of the server, and whether a sleep-mode server sleeps (None: no verdict, probed again)."""
        if self.daemon.deps.health is not None:
            return self.daemon.deps.health(dep.host, dep.port, timeout)
        result = check_health(dep.host, dep.port, timeout=timeout)
        if result.own_error:  # out of descriptors or memory here: no verdict on the server, probed again
            self.log.warning("health_probe_not_sent", error=result.error)
            return None
        # Dev mode's /sleep is open to anyone on loopback: a sleep dankserve did not ask for is noticed.
        sleeping = (
            result.healthy and has_sleep_mode(dep) and self.daemon.deps.is_sleeping(dep.host, dep.port, _api_key(dep))
        )
        return m.HealthChecked(result.status, result.error, sleeping=bool(sleeping))

    def _run_command(self, command: m.Command) -> m.Event | None:
        daemon = self.daemon
        settings = daemon.settings
        with self.lock:
            dep = self.dep
        match command:
            case m.Note(event=event, level=level, fields=fields):
                getattr(self.log, level)(event, **dict(fields))
            case m.EnsureWeights():
                return self._fetch_weights(dep)
            case m.EnsureImage():
                runtime = daemon.deps.runtime_for(dep)
                image_ref = (dep.executable or "") if dep.runtime == "process" else dep.image
                image = runtime.ensure_image(image_ref, dep.pull, lambda p: self.log.info("pull", status=p.status))
                return m.ImageReady(image.vllm_version or None, image.digest or None)
            case m.PlanBoot(overrides=overrides, vllm_version=version, digest=digest):
                return self._plan_boot(dep, overrides, version, digest)
            case m.StopWorkload(workload_id=wid):
                self._unfollow(wid)
                self._runtime_of(wid, dep).stop(wid, settings.stop_timeout_seconds)
            case m.RemoveWorkload(workload_id=wid, best_effort=best_effort):
                self._unfollow(wid)
                try:
                    self._runtime_of(wid, dep).remove(wid)
                except Exception as exc:
                    if not best_effort:
                        raise
                    self.log.warning("remove_failed", container_id=wid, error=str(exc))
                self._runtimes.pop(wid, None)
            case m.AcquireGpus(uuids=uuids):
                return self._acquire_gpus(uuids)
            case m.ReleaseGpus():
                self._release()
            case m.ReadFreeMemory(uuids=uuids, settle_first=settle_first):
                if settle_first:
                    # A server that just died may still hold GPU memory for a moment: the baseline
                    # (and the learned-bytes guard) must not read that as another tenant's memory.
                    wait_dead_processes_released(uuids, timeout=15)
                return m.FreeMemoryRead(self._free_now(uuids, dep))
            case m.StartWorkload(overrides=overrides, vllm_version=version, launcher_id=launcher_id):
                return self._start(dep, overrides, version, launcher_id)
            case m.CheckPort():
                holder = daemon.deps.check_port(dep.host, dep.port)
                return m.PortFree() if holder is None else m.PortBusy(dep.port, holder)
            case m.StopServer() | m.WaitExit(server=int()):
                return self._launcher_command(command, dep)
            case m.RemoveLauncher():
                self._remove_launcher(dep)
            case m.FollowLogs(workload_id=wid, resume=resume, server=server):
                self._follow(dep, wid, resume, server)
            case m.WaitExit(workload_id=wid, timeout=timeout):
                ended = self._runtime_of(wid, dep).wait(wid, timeout=timeout)
                return m.StillRunning() if ended is None else m.Exited(ended.exit_code, ended.oom_killed)
            case m.ProbeHealth(timeout=timeout):
                return self._probe_health(dep, timeout)
            case m.WarmUp(timeout=timeout):
                began = time.monotonic()
                model = served_model_name(tuple(dep.extra_args), dep.model)
                error = daemon.deps.warm_up(dep.host, dep.port, model, _api_key(dep), timeout)
                return m.WarmedUp(error, time.monotonic() - began)
            case m.CountGpuTenants(uuids=uuids):
                return m.GpuTenants(daemon.other_gpu_processes(uuids), daemon.deps.draw())
            case m.SleepServer() | m.WakeServer():
                return self._swap(dep, command)
            case _:
                self._record(command)
        return None

    def _acquire_gpus(self, uuids: tuple[str, ...]) -> m.Event:
        """The GPUs' boot slot, once a swap group member's boot has room (StopRequested when stopped meanwhile).

        While it waits, `waiting_for` says for what (status and `up` show it)."""
        self._release()
        try:
            if not self.daemon.swap_groups.admit_boot(self.name, uuids, self._stopping, waits=self._waits_for):
                return m.StopRequested(keep_launcher=self._keep_launcher)
            gpu_index = {g.uuid: g.index for g in self.daemon.host.gpus}

            def slot_waits(uuid: str, other: str) -> None:
                self._waits_for(f"GPU {gpu_index.get(uuid, uuid)} boots one deployment at a time: {other} boots there")

            slot = self.daemon.gpu_locks.acquire(uuids, self._stopping, holder=self.name, waits=slot_waits)
        finally:
            self._waits_for(None)
        if slot is None:
            return m.StopRequested(keep_launcher=self._keep_launcher)
        self._slot = slot
        return m.GpusAcquired()

    def _waits_for(self, why: str | None) -> None:
        with self.lock:
            self._waiting = why

    @property
    def waiting_for(self) -> str | None:
        """What the current boot waits for before it may take its GPUs (None: it does not wait)."""
        with self.lock:
            return self._waiting

    @property
    def phase_since(self) -> float:
        """When (the worker's monotonic clock) the current phase began."""
        with self.lock:
            return self._phase_since

    def _launcher_command(self, command: m.StopServer | m.WaitExit, dep: DeploymentSettings) -> m.Event | None:
        """The commands about a launcher's server (issue 15)."""
        settings = self.daemon.settings
        run_dir = launcher_run_dir(settings, self.name)
        if isinstance(command, m.StopServer):
            self._unfollow(command.workload_id)
            launching.stop_server(run_dir, settings.stop_timeout_seconds)
            return None
        wid = command.workload_id
        return launching.wait_server(self._runtime_of(wid, dep), wid, run_dir, command.timeout)

    def _remove_launcher(self, dep: DeploymentSettings) -> None:
        """The deployment's launcher, kept running without a server, goes (best effort: the daemon is stopping)."""
        if not dep.launcher:
            return
        try:
            removed = launching.remove_launcher(
                self.daemon.deps.runtime_for(dep), self.name, self.daemon.settings.stop_timeout_seconds
            )
        except Exception as exc:
            self.log.warning("launcher_remove_failed", error=str(exc))
            return
        if removed is not None:
            self._unfollow(removed)
            self._runtimes.pop(removed, None)
            self.log.info("launcher_removed", container_id=removed)

    def _record(self, command: m.Command) -> None:
        """The commands that only write the state file."""
        daemon = self.daemon
        match command:
            # Telemetry first: status reads the state file's counts, then telemetry's, so a status taken
            # while the file is written (the GIL is released) never shows a restart without its cause.
            case m.RecordFailure(cause=cause, message=message):
                daemon.telemetry.failed(self.name, cause)
                daemon.state.record_failure(self.name, cause, message, self.clock.time())
                self._last_cause = cause
            case m.RecordRestart():
                daemon.telemetry.restarted(self.name, self._last_cause or FailureCause.OTHER.value)
                daemon.state.record_restart(self.name)
            case m.RecordBoot():
                self._record_boot(command)
            case m.ForgetLearned(boot_key=key):
                daemon.state.forget_learned(self.name, key)
            case m.SetRemediation(overrides=values, remediated=causes):
                daemon.state.set_remediation(self.name, dict(values), causes)

    # -- commands with more to them ----------------------------------------------------------------
    def _swap(self, dep: DeploymentSettings, command: m.SleepServer | m.WakeServer) -> m.Event:
        """Sleep at level 1 or 2 through vLLM's route, or (`stop`) stop and remove the server; or wake it."""
        deps = self.daemon.deps
        if isinstance(command, m.WakeServer):
            return deps.wake_server(dep.host, dep.port, _api_key(dep), command.level)
        workload_id, level = command.workload_id, command.level
        if level != "stop":
            return deps.sleep_server(dep.host, dep.port, _api_key(dep), level)
        started = self.clock.monotonic()
        self._unfollow(workload_id)
        if command.server is not None:  # the launcher stays: the wake asks it for a new server
            launching.stop_server(
                launcher_run_dir(self.daemon.settings, self.name), self.daemon.settings.stop_timeout_seconds
            )
            return m.FellAsleep(self.clock.monotonic() - started)
        runtime = self._runtime_of(workload_id, dep)
        runtime.stop(workload_id, self.daemon.settings.stop_timeout_seconds)
        runtime.remove(workload_id)
        self._runtimes.pop(workload_id, None)
        return m.FellAsleep(self.clock.monotonic() - started)

    def _fetch_weights(self, dep: DeploymentSettings) -> m.WeightsReady | m.WeightsFailed:
        fetch = self.daemon.deps.fetch_weights
        if fetch is not None:
            # Progress is stepped at once (it only updates the percentage); the answer ends the command.
            failed = fetch(self.name, dep, lambda percent: self._feed(m.WeightsProgress(percent)))
            if failed is not None:
                return failed
        return m.WeightsReady()

    def _plan_boot(
        self, dep: DeploymentSettings, overrides: BootOverrides, version: str | None, digest: str | None
    ) -> m.Event:
        daemon = self.daemon
        runtime = daemon.deps.runtime_for(dep)
        host = daemon.host
        plan = daemon.deps.planner(self.name, dep, host, replace(overrides, kv_cache_memory_bytes=None), version)
        for warning in plan.warnings:
            self.log.warning("plan_warning", warning=warning)
        uuids = plan.gpu_uuids
        if dep.swap_group is not None:
            daemon.swap_groups.record_plan(
                self.name,
                PlanFacts(
                    utilization=plan.gpu_memory_utilization,
                    weights_bytes=plan.weights_bytes,
                    sleep_mode=plan.sleep_mode,
                ),
            )
        boot_key = learning.boot_fingerprint(
            vllm=digest or version or plan.vllm_version,
            model=dep.model,
            revision=dep.revision,
            gpus=[
                *(GpuIdentity(g.name, g.memory_total_bytes) for g in _assigned(host, uuids)),
                *(identity for identity, _ in self._follower_gpus(dep, strict=True)),
            ],
            flags=learning.MemoryFlags.from_argv(plan.argv),
        )
        # A boot an earlier daemon left running holds its GPUs' slot (claimed at start-up) until ready.
        claimed = daemon.take_claimed_slot(self.name)
        if claimed is not None:
            self._release()
            self._slot = claimed
        found = runtime.find(self.name)
        existing = None
        if found is not None:
            self._runtimes[found.id] = runtime
            existing = m.ExistingWorkload(found.id, found.running, found.fingerprint == plan.fingerprint)
            if launching.is_launcher(found) and found.running:
                spec = workload_spec(plan, dep, daemon.settings, 0) if dep.launcher else None
                run_dir = launcher_run_dir(daemon.settings, self.name)
                existing = launching.found_launcher(found, run_dir, spec, plan.fingerprint)
        sleeping = None
        server_runs = existing is not None and existing.running
        if existing is not None and existing.launcher is not None:
            server_runs = server_runs and existing.launcher.server_running
        if dep.swap_group is not None and server_runs:
            # A member an earlier daemon (killed with -9) left running may sleep: adopted asleep, not woken.
            sleeping = daemon.deps.is_sleeping(dep.host, dep.port, _api_key(dep))
        kept = daemon.state.deployment(self.name)
        remembered, moving = (kept.asleep, kept.swapping) if dep.swap_group is not None else (None, None)
        return m.BootPlanned(
            uuids=uuids,
            boot_key=boot_key,
            learned=daemon.state.learned(self.name, boot_key),
            vllm_version=version or plan.vllm_version,
            planned_utilization=plan.gpu_memory_utilization,
            band_top=daemon.utilization_band_top(uuids),
            existing=existing,
            adoptable=runtime.adoptable(),
            sleeping=sleeping,
            remembered_asleep=m.SLEEP_LEVELS.get(remembered or ""),
            remembered_moving=m.SWAP_MOVES.get(moving or ""),
        )

    def _start(
        self, dep: DeploymentSettings, overrides: BootOverrides, version: str | None, launcher_id: str | None = None
    ) -> m.Event:
        daemon = self.daemon
        # A kept launcher's container publishes the port itself: the check is for a new workload.
        holder = daemon.deps.check_port(dep.host, dep.port) if launcher_id is None else None
        if holder is not None:
            return m.PortBusy(dep.port, holder)
        plan = daemon.deps.planner(self.name, dep, daemon.host, overrides, version)
        boot = daemon.state.next_boot(self.name)
        # Both are mounted into the container; a missing source would fail the start.
        compile_cache_dir(daemon.settings, self.name).mkdir(parents=True, exist_ok=True, mode=0o700)
        daemon.settings.hf_cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        spec = workload_spec(plan, dep, daemon.settings, boot)
        if launcher_id is not None:
            runtime = self._runtime_of(launcher_id, dep)
            timeout = self._machine.config.boot_timeout_seconds
            run_dir = launcher_run_dir(daemon.settings, self.name)
            return launching.start_server(runtime, launcher_id, run_dir, spec, boot, timeout=timeout, new=False)
        runtime = daemon.deps.runtime_for(dep)
        if spec.launcher is not None:
            spec.launcher.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        workload = runtime.start(spec)
        self._runtimes[workload.id] = runtime
        if spec.launcher is not None:
            timeout = self._machine.config.boot_timeout_seconds
            return launching.start_server(
                runtime, workload.id, spec.launcher.run_dir, spec, boot, timeout=timeout, new=True
            )
        return m.WorkloadStarted(workload.id, boot)

    def _follow(self, dep: DeploymentSettings, workload_id: str, resume: bool, server: int | None = None) -> None:
        if not resume:
            self._reader = BootLogReader()
            self._fed = 0
        self._follower += 1
        self._following = workload_id
        runtime = self._runtime_of(workload_id, dep)
        # A multi-host group reports a lost member as an event (a single workload has none).
        runtime.watch_members(lambda reason: self._inbox.put(m.MemberLost(reason)))
        LogPump(
            runtime,
            workload_id,
            self._inbox,
            number=self._follower,
            name=self.name,
            logger=self.log,
            skip=self._fed,
            server=server,
        )

    def _unfollow(self, workload_id: str) -> None:
        if self._following == workload_id:
            self._follower += 1  # what the old follower still sends is dropped
            self._following = None

    def _runtime_of(self, workload_id: str, dep: DeploymentSettings) -> Runtime:
        return self._runtimes.get(workload_id) or self.daemon.deps.runtime_for(dep)

    def _release(self) -> None:
        if self._slot is not None:
            self._slot.release()
            self._slot = None

    def _record_boot(self, command: m.RecordBoot) -> None:
        state = self.daemon.state
        boot = self.machine.boot
        adopted = boot is not None and boot.adopted
        state.record_boot(self.name, command.facts, command.kv_bytes, command.learned_used, adopted=adopted)
        if boot is not None and not boot.adopted:  # an adopted boot's start was not seen: no duration, no kind
            took = round((boot.ready_at or self.clock.monotonic()) - boot.started_at, 3)  # recorded as it turns ready
            kind = boot_kind(
                compile_cache_hit=command.facts.compile_cache_hit,
                learned_bytes_used=command.learned_used,
                wake=self.machine.swap.since is not None,  # a swap group member woken by booting
            )
            self.daemon.telemetry.booted(self.name, kind, took, command.facts.compile_cache_hit)
            if kind != "wake":  # a wake by booting is timed as the wake it is (_publish)
                self._timed(prediction.timing_kind(kind), took)
        self.daemon.observatory.poke()
        if command.baseline and command.boot_key is not None:
            learned = learning.learn_from_boot(command.facts, command.baseline, self.clock.time())
            if learned is not None and state.learned(self.name, command.boot_key) is None:
                state.remember_learned(self.name, command.boot_key, learned)
                self.log.info("kv_cache_learned", kv_cache_memory_bytes=learned.kv_cache_memory_bytes)

    def _timed(self, kind: str, seconds: float) -> None:
        """A boot, wake or sleep took `seconds`: compared with its prediction (before it joins the history)."""
        expected = prediction.predict(self.daemon.state.deployment(self.name).timings).of(kind)
        if kind != "sleep" and prediction.slower_than_predicted(seconds, expected):
            self.log.warning("slower_than_predicted", kind=kind, seconds=seconds, predicted_seconds=expected)
            self.daemon.telemetry.slower_than_predicted(self.name, kind)
        self.daemon.state.record_timing(self.name, kind, seconds)

    def _follower_gpus(self, dep: DeploymentSettings, *, strict: bool) -> Sequence[tuple[GpuIdentity, int]]:
        """A group's followers' GPUs (none for a single host)."""
        found = self.daemon.deps.follower_gpus
        return found(self.name, dep, strict) if found is not None and dep.hosts else ()

    def _free_now(self, uuids: tuple[str, ...], dep: DeploymentSettings) -> tuple[int | None, ...]:
        """Free bytes per GPU in learning order (this host's, then every follower's); None where unknown."""
        readings = self.daemon.free_memory(uuids)
        free = [readings[u].free_bytes if u in readings else None for u in uuids]
        return (*free, *(free_bytes for _, free_bytes in self._follower_gpus(dep, strict=False)))


def _api_key(dep: DeploymentSettings) -> str | None:
    """The server's API key (sent to its sleep-mode routes too); None without one or when unreadable."""
    return read_key_now(dep.api_key_file)


_INSTANT = (m.Note, m.RecordFailure, m.RecordRestart, m.RecordBoot, m.ForgetLearned, m.SetRemediation, m.ReleaseGpus)
"""Commands that never wait and never answer: run before the new state is published."""


def _assigned(host: Host, uuids: tuple[str, ...]) -> list[Any]:
    by_uuid = {g.uuid: g for g in host.gpus}
    return [by_uuid[u] for u in uuids if u in by_uuid]


class Daemon:
    """Supervises every enabled deployment until told to stop."""

    def __init__(self, settings: Settings, deps: DaemonDeps, config_path: Path | None = None) -> None:
        self.settings = settings
        self._config_path = config_path
        self.deps = deps
        self.state = StateBook(settings.state_dir)
        self.notifier = SystemdNotifier.from_environ()
        self.gpu_locks = GpuBootLocks()
        self.workers: dict[str, DeploymentWorker] = {}
        """Changed only under `_lock` (control thread, main thread); readers take `snapshot()`."""
        self._retiring: list[DeploymentWorker] = []
        """Workers told to stop by a reload, still stopping: reaped by the main loop, never waited on there."""
        self._stops_failed: set[str] = set()
        """Deployments whose server a stop could not reach (run exits 3 then)."""
        self.host: Host = deps.load_host()
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._ready_sent = False
        self._lock = threading.RLock()
        self._claimed_slots: dict[str, BootSlot] = {}
        self.swap_groups = SwapGroups(self, deps.available_ram)
        self.config_loaded_at = time.time()
        """When the running settings were read: at start (just before), then at each accepted reload."""
        self.config_refusal: ConfigRefusal | None = None
        """The last reload's refusal (the running config stayed), None once a reload is accepted."""
        self._reloads = threading.Condition()
        self._reloads_asked = 0
        self._reloads_done = 0
        self._last_reload: ReloadOutcome | None = None
        self.telemetry = Telemetry()
        self.observatory = Observatory(
            targets=self._serving_targets,
            read_gpus=lambda: read_gpu_memory([g.uuid for g in self.host.gpus], deps.hardware_file, self.host),
            telemetry=self.telemetry,
            interval=settings.serving_scrape_interval_seconds,
            preemption_interval=settings.preemption_warning_interval_seconds,
        )

    def _serving_targets(self) -> list[ServingTarget]:
        """The ready deployments, whose /metrics the observatory reads."""
        targets = []
        for name, worker in self.snapshot().items():
            if worker.machine.stage is m.Stage.READY:
                with worker.lock:
                    dep = worker.dep
                targets.append(ServingTarget(name, dep.host, dep.port))
        return targets

    # -- called by workers -------------------------------------------------------------------
    def phase_changed(self) -> None:
        self._changed.set()
        self.swap_groups.poke()

    def take_claimed_slot(self, name: str) -> BootSlot | None:
        """The boot slot claimed at start-up for the deployment's running workload (once), if any."""
        with self._lock:
            return self._claimed_slots.pop(name, None)

    def gpu_memory(self, uuids: tuple[str, ...]) -> dict[str, GpuMemory]:
        return read_gpu_memory(uuids, self.deps.hardware_file, self.host)

    def free_memory(self, uuids: tuple[str, ...]) -> dict[str, GpuMemory]:
        """Free memory for boot learning: the recorded host file when one drives this run, else NVML.

        Never the start-up snapshot: a GPU NVML cannot read now is left out (unknown), and an
        unknown reading never passes the learned-bytes guard."""
        if self.deps.hardware_file is not None:
            return self.gpu_memory(uuids)
        return read_nvml(uuids) or {}

    def utilization_band_top(self, uuids: tuple[str, ...]) -> float | None:
        """The top of the utilisation table band of the smallest of these GPUs."""
        from dankserve.plan.rules import smallest_gpu, utilisation_row

        gpus = [g for g in self.host.gpus if g.uuid in uuids]
        return utilisation_row(smallest_gpu(gpus)).top if gpus else None

    def other_gpu_processes(self, uuids: tuple[str, ...]) -> bool | None:
        """NVML lists compute processes on these GPUs (ours are stopped when this is asked); None: unknown.

        A recorded host file (stand-in GPUs) lists no processes: none."""
        if self.deps.hardware_file is not None:
            return False
        readings = read_nvml(uuids)
        if readings is None or any(r.other_processes is None for r in readings.values()):
            return None
        return any((r.other_processes or 0) > 0 for r in readings.values())

    # -- lifecycle ---------------------------------------------------------------------------
    def run(self) -> ExitCode:
        """Run until SIGTERM/SIGINT; the exit code for the process (3 when a server could not be stopped)."""
        code = self._run()
        if self._stops_failed and code is ExitCode.OK:
            log.error("servers_left_running", deployments=sorted(self._stops_failed))
            return ExitCode.ENVIRONMENT
        return code

    def stop_failed(self, name: str) -> None:
        """A worker could not stop its server (the daemon out of descriptors or memory throughout)."""
        with self._lock:
            self._stops_failed.add(name)

    def _run(self) -> ExitCode:
        held = instance.acquire(self.settings.state_dir)
        raise_descriptor_limit()
        control = ControlServer(socket_path(self.settings.state_dir), self.handle_request)
        previous = self._install_signals()
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
            close_metrics = self._start_metrics()
            if self.deps.services is not None:
                close_services = self.deps.services(self)
            starting = {n: d for n, d in self.settings.deployments.items() if d.enabled and not self.state.is_down(n)}
            self.swap_groups.start()
            self._claim_running_boots(starting)
            for name, dep in starting.items():
                self._start_worker(name, dep, unless_running=True)
            if not self.snapshot():
                log.info("no_deployments", hint="configure [deployments.NAME] or `dankserve up NAME`")
            self._main_loop()
            return ExitCode.OK
        finally:
            self.notifier.stopping()
            close_metrics()  # first: the descriptors its peers hold are free for stopping the servers
            self.swap_groups.close()
            self._stop_all()
            close_services()
            self.observatory.close()
            control.close()
            self.state.flush()
            held.release()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            log.info("daemon_stopped")

    def _start_metrics(self) -> Callable[[], None]:
        """Serve /metrics on `metrics_listen` (nothing when unset); the function that stops it."""
        from dankserve.settings import is_loopback, parse_listen, read_secret_file
        from dankserve.supervisor.metrics import MetricsServer

        if self.settings.metrics_listen is None:
            return lambda: None
        address, port = parse_listen(self.settings.metrics_listen)
        key_file = self.settings.metrics_api_key_file
        key = None
        if key_file is not None:
            key = read_secret_file(
                key_file,
                "metrics_api_key_file",
                fix="write a long random key into it (e.g. `openssl rand -hex 32`), mode 0600, "
                "or leave metrics_api_key_file unset",
            )
        server = MetricsServer(address, port, self.metrics_snapshot, key)
        try:
            server.start()
        except OSError as exc:
            raise EnvironmentUnusable(
                f"cannot serve metrics on {self.settings.metrics_listen}: {exc.strerror or exc}",
                fix="choose a free address and port in metrics_listen, or leave it unset for no metrics endpoint",
            ) from None
        if not is_loopback(address) and key is None:
            log.warning(
                "metrics_exposed", listen=self.settings.metrics_listen, hint="anyone reaching it reads the metrics"
            )
        log.info("metrics_listening", listen=self.settings.metrics_listen)
        return server.close

    def metrics_snapshot(self) -> MetricsSnapshot:
        """What /metrics shows now: the same documents, telemetry and readings status reads."""
        from dankserve.supervisor.metrics import DeploymentFacts, MetricsSnapshot

        facts = []
        workers = self.snapshot()
        for name in sorted(self.settings.deployments):
            view = self._deployment_view(name, workers.get(name), with_hosts=False)
            facts.append(
                DeploymentFacts(
                    name=view.name,
                    state=view.state,
                    phase=view.phase,
                    model=view.model,
                    image=view.image,
                    vllm_version=view.vllm_version,
                    kv_cache_memory_bytes=view.kv_cache_memory_bytes,
                    kv_cache_learned_used=view.kv_cache_learned_used,
                    ready_seconds=view.uptime_seconds,
                    swap_group=view.swap_group,
                    sleep_level=view.sleep_level,
                )
            )
        return MetricsSnapshot(
            deployments=tuple(facts),
            telemetry=self.telemetry.snapshot(),
            serving=self.observatory.samples(),
            scrape_ok=self.observatory.scrape_ok(),
            gpus=self.observatory.gpus(),
        )

    def _claim_running_boots(self, deployments: Mapping[str, DeploymentSettings]) -> None:
        """Before any worker starts: give each workload an earlier daemon left running its GPUs' boot slot.

        Its worker adopts it and keeps the slot until it is ready, so no other deployment on those
        GPUs starts booting meanwhile (workers start in no fixed order; this runs before all of them).
        Anything that fails here is left to the worker, which looks again.
        """
        for name, dep in deployments.items():
            try:
                existing = self.deps.runtime_for(dep).find(name)
                if existing is None or not existing.running:
                    continue
                overrides = BootOverrides.from_remediation(self.state.deployment(name).overrides)
                uuids = self.deps.planner(name, dep, self.host, overrides, None).gpu_uuids
            except Exception as exc:
                log.warning("claim_skipped", deployment=name, error=str(exc))
                continue
            slot = self.gpu_locks.try_acquire(uuids)
            if slot is not None:
                self._claimed_slots[name] = slot

    def request_stop(self) -> None:
        self._stop.set()
        self._changed.set()

    def check_fit(self, settings: Settings) -> None:
        """Plan every enabled deployment of `settings` and check they fit together: GPUs shared within 0.95
        (a swap group counting what may be awake at once), CPU offload within the host's RAM. Raises the user
        error. At start (preflight) and before a reload takes effect: a reload that would over-commit a GPU
        (a member leaving its group, a changed `pinned`, a new deployment) is refused like a malformed file.
        A follower of a multi-host group that is not up yet is not an error here: its worker retries with
        backoff. Neither is a Hub that does not answer for a model not yet cached (the network may come up
        later): its worker downloads first, or plans again later."""
        from dankserve.errors import MemberUnreachable
        from dankserve.plan.checks import check_fit_together

        plans = []
        for name, dep in settings.deployments.items():
            if not dep.enabled:
                continue
            try:
                plans.append(self.deps.planner(name, dep, self.host, BootOverrides(), None))
            except (MemberUnreachable, HubUnreachable):
                continue
        check_fit_together(plans, settings.deployments.items(), self.host)

    def request_reload(self) -> None:
        """Reload at the main loop's next turn (SIGHUP: the handler must not wait)."""
        self._reload.set()
        self._changed.set()

    def reload_and_wait(self, timeout: float) -> ReloadOutcome | None:
        """Ask for a reload that reads the file after now and wait for its outcome (None: not done in time)."""
        with self._reloads:
            self._reloads_asked += 1
            mine = self._reloads_asked
        self.request_reload()
        with self._reloads:
            if not self._reloads.wait_for(lambda: self._reloads_done >= mine, timeout):
                return None
            return self._last_reload

    def _install_signals(self) -> dict[int, Any]:
        previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return previous

        def on_stop(signum: int, frame: FrameType | None) -> None:
            self.request_stop()

        def on_hup(signum: int, frame: FrameType | None) -> None:
            self.request_reload()

        for sig, handler in ((signal.SIGTERM, on_stop), (signal.SIGINT, on_stop), (signal.SIGHUP, on_hup)):
            previous[sig] = signal.signal(sig, handler)
        return previous

    def snapshot(self) -> dict[str, DeploymentWorker]:
        """The workers now (a copy: the control thread may add or remove some meanwhile)."""
        with self._lock:
            return dict(self.workers)

    def _start_worker(
        self, name: str, dep: DeploymentSettings, *, join_asleep: bool = False, unless_running: bool = False
    ) -> None:
        """A worker for the deployment; `unless_running`: none when one already runs it (the start-up loop
        races `dankserve up NAME`, answered on the control socket meanwhile: two workers booted two servers)."""
        worker = DeploymentWorker(name, dep, self, join_asleep=join_asleep)
        with self._lock:
            existing = self.workers.get(name)
            if unless_running and existing is not None and existing.alive:
                return
            self.workers[name] = worker
            worker.start()  # under the lock: a worker others can see is alive

    def _main_loop(self) -> None:
        watchdog = watchdog_interval()
        notify = self.notifier
        next_watchdog = 0.0
        next_extend = 0.0
        last_status = ""
        while not self._stop.is_set():
            wait = 0.25 if watchdog is None else max(0.0, min(0.25, next_watchdog - time.monotonic()))
            self._changed.wait(wait)
            self._changed.clear()
            if self._reload.is_set():
                self._reload.clear()
                with self._reloads:
                    asked = self._reloads_asked  # read before the file is: these requests are answered by it
                outcome = self._apply_reload()
                with self._reloads:
                    self._reloads_done = max(self._reloads_done, asked)
                    self._last_reload = outcome
                    self._reloads.notify_all()
            with self._lock:
                self._retiring = [w for w in self._retiring if w.alive]
            workers = self.snapshot()
            phases = {name: w.phase for name, w in workers.items()}
            percents = {name: w.machine.weights_percent for name, w in workers.items()}
            text = status_line(phases, percents).text
            if text != last_status:
                notify.status(text)
                last_status = text
            if not self._ready_sent and all_settled(phases):
                notify.ready()
                self._ready_sent = True
                log.info("daemon_ready", deployments=len(phases))
            now = time.monotonic()
            if not self._ready_sent and now >= next_extend:
                # Long first boots: keep extending systemd's start timeout while we make progress.
                notify.extend_timeout(int(60 * 1e6))
                next_extend = now + 20
            if watchdog is not None and now >= next_watchdog:
                if all(w.alive or w.phase in (Phase.FAILED, Phase.STOPPED) for w in workers.values()):
                    notify.watchdog()
                next_watchdog = now + watchdog / 2

    def _stop_all(self) -> None:
        with self._lock:
            workers = [*self.workers.values(), *self._retiring]
        for worker in workers:
            worker.request_stop()
        deadline = time.monotonic() + self.settings.stop_timeout_seconds + 15
        for worker in workers:
            worker.join(max(0.1, deadline - time.monotonic()))
        for worker in workers:
            if worker.alive:  # still stopping at the deadline: its server may outlive the daemon
                self.stop_failed(worker.name)
        # A worker that ended (stopped, or failed: its launcher idles on for `up`) stops nothing more itself.
        self._remove_idle_launchers({w.name for w in workers if w.alive})

    def _remove_idle_launchers(self, supervised: set[str]) -> None:
        """SIGTERM leaves nothing running: the launchers of deployments without a running worker go too (kept by
        `down`, or idle after the deployment failed)."""
        for name, dep in self.settings.deployments.items():
            if name in supervised or not dep.launcher:
                continue
            try:
                removed = launching.remove_launcher(
                    self.deps.runtime_for(dep), name, self.settings.stop_timeout_seconds
                )
                if removed is not None:
                    log.info("launcher_removed", deployment=name, container_id=removed)
            except Exception as exc:
                log.warning("launcher_remove_failed", deployment=name, error=str(exc))

    def _read_reload(self, now: float) -> Settings | ConfigRefusal:
        """The config file's settings, checked like a start; or why they are refused."""
        from dankserve.settings import load_settings

        try:
            new = load_settings(self._config_path)
            self.check_fit(new)
        except Exception as exc:  # any failure keeps the running config and deployments
            if isinstance(exc, DankserveError):
                return ConfigRefusal(now, exc.message, exc.fix)
            return ConfigRefusal(now, f"internal error: {type(exc).__name__}: {exc}", None)
        return new

    def _apply_reload(self) -> ReloadOutcome:
        now = time.time()
        new = self._read_reload(now)
        if isinstance(new, ConfigRefusal):
            log.error("reload_rejected", error=new.error, fix=new.fix, keeping="the running configuration")
            self.config_refusal = new
            return ReloadOutcome(now, new)
        self.config_refusal = None
        self.config_loaded_at = now
        old = self.settings
        self.settings = new
        restart: list[str] = []
        start: list[str] = []
        stop: list[str] = []
        keep: list[str] = []
        for name, worker in self.snapshot().items():
            dep = new.deployments.get(name)
            if dep is None or not dep.enabled:
                # Not waited for here: this thread sends WATCHDOG=1, and a stop may take stop_timeout_seconds.
                log.info("reload_stop", deployment=name)
                stop.append(name)
                worker.request_stop()
                with self._lock:
                    self.workers.pop(name, None)
                    self._retiring.append(worker)
            elif dep != (before := old.deployments.get(name)):
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
        running = self.snapshot()
        groups = [new.deployments[n].swap_group for n, w in running.items() if w.alive and n in new.deployments]
        for name, dep in new.deployments.items():
            if name not in running and dep.enabled and not self.state.is_down(name):
                asleep = swap.joins_asleep(dep.swap_group, groups)
                log.info("reload_start", deployment=name, joins_asleep=asleep)
                start.append(name)
                self._start_worker(name, dep, join_asleep=asleep)
        log.info("reload_accepted", restart=restart, start=start, stop=stop, keep=keep)
        return ReloadOutcome(now, None, tuple(restart), tuple(start), tuple(stop), tuple(keep))

    # -- control requests --------------------------------------------------------------------
    def handle_request(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """A control request's answer (`supervisor.requests`' verb table)."""
        return requests.answer(self, request)

    def take_down(self, name: str) -> None:
        """`dankserve down NAME`: remembered as down; returns once its worker stopped."""
        with self._lock:
            self.state.set_down(name, True)
            worker = self.workers.pop(name, None)
        if worker is not None:  # waited for (the CLI's `down` returns once stopped), outside the lock
            worker.request_stop(keep_launcher=True)
            worker.join(self.settings.stop_timeout_seconds + 15)

    def bring_up(self, name: str) -> None:
        """`dankserve up NAME`: no longer down; its worker started unless one runs."""
        with self._lock:
            self.state.set_down(name, False)
            existing = self.workers.get(name)
            if existing is None or not existing.alive:
                self._start_worker(name, self.settings.deployments[name])

    def swap_and_wait(self, verb: Literal["sleep", "wake"], name: str) -> dict[str, Any]:
        """`dankserve sleep NAME` / `dankserve wake NAME`: answered once asleep or ready (or given up)."""
        dep = self.settings.deployments[name]
        if dep.swap_group is None:
            return {"ok": False, "error": f"deployment {name!r} is in no swap group: set swap_group to let it sleep"}
        worker = self.snapshot().get(name)
        if worker is None:
            return {"ok": False, "error": f"deployment {name!r} is not running (`dankserve up {name}` starts it)"}
        if verb == "sleep":
            error = self.swap_groups.sleep(name, "by hand (`dankserve sleep`)")
            goal, wait = m.Stage.ASLEEP, sleep_mode.SLEEP_TIMEOUT_SECONDS
        else:
            error = None
            self.swap_groups.wake(name)
            goal, wait = m.Stage.READY, self.settings.boot_timeout_seconds
        if error is not None:
            return {"ok": False, "error": error}
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            state = worker.machine
            refused = self.swap_groups.refused(name)
            if state.stage is goal:
                return {"ok": True, "status": self._deployment_status(name, worker)}
            if refused is not None:
                return {"ok": False, "error": f"cannot wake {name!r}: {refused}"}
            if state.stage in m.TERMINAL or (state.stage is m.Stage.BACKOFF and state.last_failure is not None):
                failure = state.last_failure.message if state.last_failure is not None else state.message
                return {"ok": False, "error": f"{name!r} is {state.status}: {failure or 'see the log'}"}
            time.sleep(0.05)
        return {"ok": False, "error": f"{name!r} did not become {goal.value} within {wait:g} s"}

    def status(self) -> dict[str, Any]:
        """The `status --json` document while the daemon runs."""
        import os

        deployments = []
        workers = self.snapshot()
        for name in sorted(self.settings.deployments):
            worker = workers.get(name)
            deployments.append(self._deployment_status(name, worker))
        from dankserve.settings import resolve_config_path

        path = str(resolve_config_path(self._config_path)[0].absolute())
        daemon: dict[str, Any] = {
            "running": True,
            "pid": os.getpid(),
            "config": config_status(path, self.config_loaded_at, self.config_refusal),
        }
        return {"daemon": daemon, "deployments": deployments, "warnings": []}

    def _deployment_status(
        self, name: str, worker: DeploymentWorker | None, *, with_hosts: bool = True
    ) -> dict[str, Any]:
        return self._deployment_view(name, worker, with_hosts=with_hosts).to_json()

    def _deployment_view(
        self, name: str, worker: DeploymentWorker | None, *, with_hosts: bool = True
    ) -> DeploymentView:
        """The deployment as status and /metrics show it."""
        dep = self.settings.deployments[name]
        record = self.state.deployment(name)
        machine = worker.machine if worker is not None else None
        gpus = []
        if machine is not None and machine.gpu_uuids:
            for reading in self.observatory.gpus(machine.gpu_uuids).values():
                gpus.append(
                    {
                        "index": reading.index,
                        "memory_used_bytes": reading.used_bytes,
                        "memory_total_bytes": reading.total_bytes,
                    }
                )
        # vLLM's numbers as the observatory last read them (the same ones /metrics relays).
        sample = self.observatory.sample(name) if machine is not None and machine.phase is Phase.READY else None
        metrics = None
        if sample is not None:
            preemptions = sample.preemptions_total
            metrics = Metrics(int(preemptions) if preemptions is not None else None, sample.kv_cache_usage_perc)
        return deployment_view(
            name,
            dep,
            record,
            machine,
            down=self.state.is_down(name),
            now=self.deps.clock.monotonic(),
            gpus=gpus,
            metrics=metrics,
            hosts=self._hosts_status(name) if with_hosts else None,
            serving=None if sample is None else sample.as_json(),
            observed=self.telemetry.of(name),
            waiting_for=worker.waiting_for if worker is not None else None,
            phase_since=worker.phase_since if worker is not None else None,
            wall_now=self.deps.clock.time(),
        )

    def _hosts_status(self, name: str) -> list[dict[str, Any]] | None:
        return self.deps.describe_hosts(name) if self.deps.describe_hosts is not None else None
