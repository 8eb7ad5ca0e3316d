"""The daemon: one worker thread per deployment, driven by pure decisions, talking to the world
through the runtime, the state store, NVML readings, sd_notify and the control socket.

Each worker loops: plan -> pull -> adopt or start -> follow the boot log -> ready -> watch
health and exit events -> on failure ask the policy what to do -> back off -> again. The main
thread handles signals (SIGTERM/SIGINT stop, SIGHUP reload), systemd notifications and the
control socket.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

import structlog

from dankserve.bootlog import BootFacts, BootLogReader, PhaseChanged
from dankserve.control import ControlServer, socket_path
from dankserve.errors import (
    DaemonResourcesExhausted,
    DankserveError,
    EnvironmentUnusable,
    PodmanUnreachable,
    resources_exhausted,
)
from dankserve.exitcodes import ExitCode
from dankserve.host.gpu_memory import GpuMemory, read_gpu_memory, wait_dead_processes_released
from dankserve.host.model import Host
from dankserve.plan.types import Plan
from dankserve.planning import compile_cache_dir
from dankserve.runtime.base import ExitEvent, Runtime, Workload
from dankserve.settings import DeploymentSettings, Settings
from dankserve.supervisor import instance, learning, policy
from dankserve.supervisor.health import check_health, fetch_metrics, idle_seconds, metric_value
from dankserve.supervisor.lifecycle import BOOTING_PHASES, Phase, advance_boot_phase, all_settled, status_line
from dankserve.supervisor.policy import FailureCause, FailureContext, RestartSettings
from dankserve.supervisor.records import StateBook, failure_json
from dankserve.supervisor.workload import workload_spec
from dankserve.systemd.notify import SystemdNotifier, watchdog_interval

log = structlog.get_logger("dankserve")

Planner = Callable[[str, DeploymentSettings, Host, "BootOverrides", str | None], Plan]
RuntimeFactory = Callable[[DeploymentSettings], Runtime]
HostLoader = Callable[[], Host]


@dataclass(frozen=True)
class BootOverrides:
    """What the supervisor changes in a deployment's plan for the next boot."""

    kv_cache_memory_bytes: int | None = None
    """A learned value to pass as --kv-cache-memory-bytes (None: let vLLM profile)."""
    max_model_len: int | str | None = None
    """A remediation of a max-length error (vLLM's estimate, or 'auto')."""
    gpu_memory_utilization: float | None = None
    """A remediation of a no-KV-memory error (the top of the table band)."""


@dataclass(frozen=True)
class Outcome:
    """How one boot-and-serve cycle ended."""

    kind: str
    """'stopped' (asked to), 'replan' (config changed), or 'failure'."""
    failure: FailureCause | None = None
    message: str | None = None
    facts: BootFacts | None = None


@dataclass(frozen=True)
class DaemonDeps:
    """The edges the daemon uses; tests swap none of them for fakes except the clock-free parts."""

    planner: Planner
    runtime_for: RuntimeFactory
    load_host: HostLoader
    hardware_file: Path | None = None
    sleep: Callable[[float], None] = time.sleep
    services: Callable[[Daemon], Callable[[], None]] | None = None
    """Started after the control socket (e.g. the cluster API); returns the function that stops it."""
    describe_hosts: Callable[[str], list[dict[str, Any]] | None] | None = None
    """The hosts of a multi-host deployment for `status` (None: a single-host one)."""
    follower_gpus: Callable[[str, DeploymentSettings, bool], Sequence[tuple[learning.GpuIdentity, int]]] | None = None
    """A group's followers' GPUs (identity, free bytes now) for boot learning; with strict=True a follower that
    does not answer raises, otherwise it is left out (so learned bytes are not reused)."""


@dataclass
class DeploymentView:
    """What `dankserve status` shows of one deployment (mutable, guarded by the worker's lock)."""

    name: str
    model: str
    image: str
    endpoint: str
    state: str = "stopped"
    phase: Phase = Phase.STOPPED
    weights_percent: int | None = None
    vllm_version: str | None = None
    container_id: str | None = None
    ready_since: float | None = None
    boots: int = 0
    restarts: int = 0
    last_failure: dict[str, Any] | None = None
    kv_cache_memory_bytes: int | None = None
    kv_cache_learned_used: bool = False
    compile_cache_hit: bool | None = None
    compile_seconds: float | None = None
    preemptions: int | None = None
    kv_cache_usage_perc: float | None = None
    gpu_uuids: tuple[str, ...] = ()
    message: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class GpuBootLocks:
    """Serialises boots that share a GPU: vLLM's memory profiling fails when another process
    frees or takes memory on the same GPU meanwhile."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    def acquire(self, uuids: tuple[str, ...], cancelled: threading.Event) -> BootSlot | None:
        """Hold every GPU's lock (sorted, so no deadlock); None if cancelled while waiting."""
        taken: list[threading.Lock] = []
        for lock in self._locks_of(uuids):
            while not lock.acquire(timeout=0.2):
                if cancelled.is_set():
                    BootSlot(taken).release()
                    return None
            taken.append(lock)
        return BootSlot(taken)

    def try_acquire(self, uuids: tuple[str, ...]) -> BootSlot | None:
        """Every GPU's lock if all are free now; else None (holding none)."""
        taken: list[threading.Lock] = []
        for lock in self._locks_of(uuids):
            if not lock.acquire(blocking=False):
                BootSlot(taken).release()
                return None
            taken.append(lock)
        return BootSlot(taken)

    def _locks_of(self, uuids: tuple[str, ...]) -> list[threading.Lock]:
        with self._guard:
            return [self._locks.setdefault(u, threading.Lock()) for u in sorted(set(uuids))]


class BootSlot:
    """The right to boot on some GPUs; released once the boot is ready or over."""

    def __init__(self, locks: list[threading.Lock]) -> None:
        self._locks = locks
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            for lock in reversed(self._locks):
                lock.release()


class LogPump:
    """Follows a workload's log in a thread: lines into `lines`, then None when the stream ends
    (the workload exited, or the runtime went away: the caller asks the runtime which)."""

    def __init__(self, runtime: Runtime, workload_id: str, name: str, logger: Any, skip: int = 0) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._runtime = runtime
        self._workload_id = workload_id
        self._skip = skip
        self._log = logger
        threading.Thread(target=self._pump, name=f"logs-{name}", daemon=True).start()

    def _pump(self) -> None:
        seen = 0
        try:
            for line in self._runtime.logs(self._workload_id, follow=True):
                seen += 1
                if seen > self._skip:  # a stream opened again replays the log from its start
                    self.lines.put(line)
        except Exception as exc:
            self._log.warning("log_stream_error", error=str(exc))
        finally:
            self.lines.put(None)


@dataclass
class RuntimeOutage:
    """While the runtime is unreachable: since when, and when to ask it again (backing off)."""

    since: float | None = None
    attempts: int = 0
    next_try: float = 0.0

    @property
    def active(self) -> bool:
        return self.since is not None

    def due(self, now: float) -> bool:
        return now >= self.next_try

    def failed(self, now: float, restart: RestartSettings) -> None:
        if self.since is None:
            self.since = now
        self.attempts += 1
        self.next_try = now + policy.outage_retry_delay(self.attempts, restart)

    def clear(self) -> None:
        self.since, self.attempts, self.next_try = None, 0, 0.0

    def seconds(self, now: float) -> float | None:
        return None if self.since is None else round(now - self.since, 1)


class DeploymentWorker:
    """Keeps one deployment serving, in its own thread."""

    def __init__(self, name: str, dep: DeploymentSettings, daemon: Daemon) -> None:
        self.name = name
        self.dep = dep
        self.daemon = daemon
        self.lock = threading.Lock()
        self.view = DeploymentView(
            name=name, model=dep.model, image=dep.image, endpoint=f"http://{dep.host}:{dep.port}/v1"
        )
        self._stop = threading.Event()
        self._replan = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"deployment-{name}", daemon=True)
        self.log = log.bind(deployment=name)
        self._boot_started: float | None = None
        self._boot_key: str | None = None
        self._learned_used: int | None = None
        self._planned_utilization: float | None = None
        self._lines: queue.Queue[str | None] | None = None

    # -- control -----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def request_stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._nudge()

    def request_replan(self, dep: DeploymentSettings) -> None:
        """Apply a changed configuration: the next cycle boots with it."""
        with self.lock:
            self.dep = dep
        self._replan.set()
        self._wake.set()
        self._nudge()

    def _nudge(self) -> None:
        """Wake the follow loop, which sleeps on its line queue until it has something to do."""
        lines = self._lines
        if lines is not None:
            lines.put("")

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def phase(self) -> Phase:
        with self.lock:
            return self.view.phase

    def booting_for(self) -> float | None:
        """Seconds the current boot has run, or None when not booting."""
        with self.lock:
            if self.view.phase in BOOTING_PHASES and self._boot_started is not None:
                return time.monotonic() - self._boot_started
        return None

    def _set(self, **changes: Any) -> None:
        with self.lock:
            for key, value in changes.items():
                setattr(self.view, key, value)
            phase = self.view.phase
        if "phase" in changes:
            self.log.info("phase", phase=phase.value)
            self.daemon.phase_changed()

    # -- the loop ----------------------------------------------------------------------------
    def _run(self) -> None:  # noqa: PLR0915  (one loop, read top to bottom, is clearer than pieces)
        daemon = self.daemon
        remembered = daemon.state.deployment(self.name)
        overrides = _overrides_from(remembered.overrides)
        remediated = frozenset(FailureCause(c) for c in remembered.remediated if c in FailureCause._value2member_map_)
        failures: list[float] = []
        relearned = False
        outages = 0
        while not self._stop.is_set():
            self._replan.clear()
            try:
                outcome = self._cycle_or_own_error(overrides)
            except (PodmanUnreachable, DaemonResourcesExhausted) as exc:
                # The runtime went away, or the daemon ran out of descriptors or memory: not the deployment's
                # fault, no failure counted, never `failed`. Retry with backoff; the next cycle adopts the
                # container if it kept running, or replaces it.
                if self._stop.is_set():
                    self.log.error("stop_incomplete", error=exc.message, container_id=self.view.container_id)
                    break
                outages += 1
                delay = policy.outage_retry_delay(outages, RestartSettings.from_settings(daemon.settings))
                self._set(
                    phase=Phase.RESTARTING,
                    state="restarting",
                    ready_since=None,
                    message=f"{exc.message}; retrying in {delay:.1f} s",
                )
                event = "runtime_unreachable" if isinstance(exc, PodmanUnreachable) else "daemon_resources_exhausted"
                self.log.warning(event, error=exc.message, retry_in_seconds=round(delay, 2))
                self._wake.clear()
                self._wake.wait(delay)
                continue
            except DankserveError as exc:
                # Planning or the runtime refused the configuration: restarting cannot help.
                self._fail(exc.render())
                return
            except Exception as exc:  # an unexpected runtime error: retry with backoff, never die
                self.log.exception("cycle_error")
                outcome = Outcome("failure", FailureCause.CRASH, f"{type(exc).__name__}: {exc}")
            outages = 0
            if outcome.kind == "stopped" or self._stop.is_set():
                self._set(phase=Phase.STOPPED, state="stopped", ready_since=None)
                return
            if outcome.kind == "replan":
                overrides, remediated, relearned = BootOverrides(), frozenset(), False
                failures.clear()
                daemon.state.set_remediation(self.name, {}, ())
                continue
            if outcome.kind == "ready_then_failed":
                relearned = False
            assert outcome.failure is not None
            cause = outcome.failure
            now = time.time()
            failures.append(now)
            daemon.state.record_failure(self.name, cause.value, outcome.message, now)
            with self.lock:
                self.view.last_failure = {"class": cause.value, "message": outcome.message, "at": now}
                dep = self.dep
            facts = outcome.facts
            context = FailureContext(
                message=outcome.message,
                max_model_len_setting=dep.max_model_len,
                estimated_max_model_len=facts.estimated_max_model_len if facts else None,
                gpu_memory_utilization_setting=dep.gpu_memory_utilization,
                gpu_memory_utilization_planned=self._planned_utilization,
                utilization_band_top=daemon.utilization_band_top(self.name),
                remediated=remediated,
                learned_kv_in_use=self._learned_used is not None,
                relearned=relearned,
                other_gpu_processes=daemon.other_gpu_processes(self.view.gpu_uuids),
            )
            decision = policy.decide(cause, context)
            self.log.warning("boot_failed", failure=cause.value, action=decision.action.value, decision=decision.reason)
            if decision.outcome == "config_error":
                self._fail(decision.reason, cause.value)
                return
            if decision.overrides:
                overrides = replace(overrides, **_override_fields(decision.overrides))
                if decision.remediation is not None:
                    remediated = remediated | {decision.remediation}
                daemon.state.set_remediation(
                    self.name, dict(decision.overrides), tuple(sorted(c.value for c in remediated))
                )
            if decision.drop_learned_kv and self._boot_key is not None:
                daemon.state.forget_learned(self.name, self._boot_key)
                relearned = True
            restart = policy.next_restart(
                failures, now, RestartSettings.from_settings(daemon.settings), immediate=not decision.backoff
            )
            if restart.kind == "failed":
                self._fail(restart.reason, cause.value)
                return
            with self.lock:
                self.view.restarts += 1
            daemon.state.record_restart(self.name)
            self._set(phase=Phase.RESTARTING, state="restarting", ready_since=None)
            self.log.info("restart_scheduled", delay_seconds=round(restart.delay_seconds, 2), reason=restart.reason)
            self._wake.clear()
            self._wake.wait(restart.delay_seconds)
        if self._stop.is_set():
            self._set(phase=Phase.STOPPED, state="stopped", ready_since=None)

    def _fail(self, message: str, cause: str | None = None) -> None:
        self._set(phase=Phase.FAILED, state="failed", ready_since=None, message=message)
        self.log.error("deployment_failed", failure=cause, failure_message=message)

    def _cycle_or_own_error(self, overrides: BootOverrides) -> Outcome:
        """`_cycle`, with an error of the daemon's own (EMFILE, ENOMEM ...) raised as DaemonResourcesExhausted."""
        try:
            return self._cycle(overrides)
        except Exception as exc:
            own = resources_exhausted(exc)
            if own is None:
                raise
            raise own from exc

    def _cycle(self, overrides: BootOverrides) -> Outcome:
        """One boot of the deployment and the time it serves, until it ends."""
        # A boot an earlier daemon left running may hold its GPUs' boot slot (claimed at start-up).
        claimed = self.daemon.take_claimed_slot(self.name)
        try:
            return self._boot_or_adopt(overrides, claimed)
        finally:
            if claimed is not None:
                claimed.release()

    def _boot_or_adopt(self, overrides: BootOverrides, claimed: BootSlot | None) -> Outcome:
        daemon = self.daemon
        with self.lock:
            dep = self.dep
        self._boot_started = time.monotonic()
        self._set(phase=Phase.PULLING, state="starting", message=None)
        runtime = daemon.deps.runtime_for(dep)
        image_ref = (dep.executable or "") if dep.runtime == "process" else dep.image
        image = runtime.ensure_image(image_ref, dep.pull, lambda p: self.log.info("pull", status=p.status))
        self._set(phase=Phase.PLANNING)
        host = daemon.host
        version = image.vllm_version

        def planned(kv_bytes: int | None) -> Plan:
            return daemon.deps.planner(
                self.name, dep, host, replace(overrides, kv_cache_memory_bytes=kv_bytes), version
            )

        base_plan = planned(None)
        for warning in base_plan.warnings:
            self.log.warning("plan_warning", warning=warning)
        uuids = base_plan.gpu_uuids
        boot_key = learning.boot_fingerprint(
            vllm=image.digest or image.vllm_version or base_plan.vllm_version,
            model=dep.model,
            revision=dep.revision,
            gpus=[
                *(learning.GpuIdentity(g.name, g.memory_total_bytes) for g in _assigned(host, uuids)),
                *(identity for identity, _ in self._follower_gpus(dep, strict=True)),
            ],
            flags=learning.MemoryFlags.from_argv(base_plan.argv),
        )
        self._boot_key = boot_key
        self._planned_utilization = _flag_float(base_plan.argv, "--gpu-memory-utilization")
        with self.lock:
            self.view.vllm_version = image.vllm_version or base_plan.vllm_version
            self.view.gpu_uuids = uuids

        existing = runtime.find(self.name)
        if existing is not None and existing.running and existing.fingerprint == base_plan.fingerprint:
            self.log.info("adopting", container_id=existing.id)
            self._learned_used = None
            # An adopted boot keeps its GPUs' slot until ready: another boot there would upset its profiling.
            return self._follow(runtime, existing, base_plan, boot_key, None, None, claimed)
        if claimed is not None:
            claimed.release()
        if existing is not None:
            self.log.info("replacing", container_id=existing.id, running=existing.running)
            runtime.stop(existing.id, daemon.settings.stop_timeout_seconds)
            runtime.remove(existing.id)

        slot = daemon.gpu_locks.acquire(uuids, self._stop)
        if slot is None:
            return Outcome("stopped")
        try:
            # A server that just died may still hold GPU memory for a moment: the baseline
            # (and the learned-bytes guard) must not read that as another tenant's memory.
            learned = daemon.state.learned(self.name, boot_key)
            settled = self._kv_decision(learned, uuids, dep)
            if settled is None:
                return Outcome("stopped")
            baseline, decision = settled
            self._learned_used = decision.use_bytes
            self.log.info("kv_cache_decision", use_bytes=decision.use_bytes, reason=decision.reason)
            plan = planned(decision.use_bytes) if decision.use_bytes is not None else base_plan
            boot = daemon.state.next_boot(self.name)
            # Both are mounted into the container; a missing source would fail the start.
            compile_cache_dir(daemon.settings, self.name).mkdir(parents=True, exist_ok=True, mode=0o700)
            daemon.settings.hf_cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._set(phase=Phase.STARTING, boots=boot, kv_cache_learned_used=decision.use_bytes is not None)
            workload = runtime.start(workload_spec(plan, dep, daemon.settings, boot))
            self.log.info("started", container_id=workload.id, boot=boot)
            return self._follow(runtime, workload, plan, boot_key, baseline, decision.use_bytes, slot)
        finally:
            slot.release()

    def _follower_gpus(self, dep: DeploymentSettings, *, strict: bool) -> Sequence[tuple[learning.GpuIdentity, int]]:
        """A group's followers' GPUs (none for a single host)."""
        found = self.daemon.deps.follower_gpus
        return found(self.name, dep, strict) if found is not None and dep.hosts else ()

    def _free_now(self, uuids: tuple[str, ...], dep: DeploymentSettings) -> list[int]:
        """Free bytes per GPU in learning order: this host's assigned GPUs, then every follower's."""
        free = _free_in_order(self.daemon.gpu_memory(uuids), uuids)
        return free + [free_bytes for _, free_bytes in self._follower_gpus(dep, strict=False)]

    def _kv_decision(
        self, learned: learning.LearnedKv | None, uuids: tuple[str, ...], dep: DeploymentSettings
    ) -> tuple[list[int], learning.KvDecision] | None:
        """The free-memory baseline now and whether to reuse the learned KV bytes (None: stopped)."""
        wait_dead_processes_released(uuids, timeout=15)
        baseline = self._free_now(uuids, dep)
        decision = learning.decide_kv_reuse(learned, baseline)
        # Measured on an H200: after kill -9 the driver frees the dead server's memory a few
        # seconds later. Give free memory time to come back before falling back to profiling.
        settle_until = time.monotonic() + self.daemon.settings.gpu_memory_settle_seconds
        while decision.use_bytes is None and learned is not None and time.monotonic() < settle_until:
            if self._stop.wait(0.5):
                return None
            baseline = self._free_now(uuids, dep)
            decision = learning.decide_kv_reuse(learned, baseline)
        return baseline, decision

    def _follow(  # noqa: PLR0915, PLR0917  (the boot-and-serve loop)
        self,
        runtime: Runtime,
        workload: Workload,
        plan: Plan,
        boot_key: str,
        baseline: Sequence[int] | None,
        learned_used: int | None,
        slot: BootSlot | None,
    ) -> Outcome:
        """Watch the workload boot and serve, until it ends or we are told to stop.

        The log stream ending means the workload exited only when the runtime says so: while
        the runtime (Podman) is unreachable the server is still probed over HTTP, and once the
        runtime answers again the log is followed on from where it broke off.
        """
        settings = self.daemon.settings
        with self.lock:
            dep = self.dep
            self.view.container_id = workload.id
        pump = LogPump(runtime, workload.id, self.name, self.log)
        self._lines = pump.lines  # stop/replan requests wake the loop through it
        reader = BootLogReader()
        fed = 0  # log lines read so far: a new stream after an outage skips them
        deadline = time.monotonic() + settings.boot_timeout_seconds
        ready = False
        next_health = 0.0
        unhealthy = 0
        log_ended = False
        lost = RuntimeOutage()  # the runtime unreachable since ..., and when to look again

        def feed(line: str) -> None:
            nonlocal fed
            fed += 1
            for event in reader.feed(line):
                self._on_boot_event(event, reader.facts)

        while True:
            if self._stop.is_set() or self._replan.is_set():
                runtime.stop(workload.id, settings.stop_timeout_seconds)
                runtime.remove(workload.id)
                return Outcome("stopped" if self._stop.is_set() else "replan")
            idle = idle_seconds(ready, reader.facts.ready, next_health, deadline, time.monotonic())
            try:
                line = pump.lines.get(timeout=idle)
            except queue.Empty:
                line = ""
            if line is None:
                log_ended = True
            elif line:
                feed(line)
                while True:  # drain what is queued without sleeping
                    try:
                        more = pump.lines.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        log_ended = True
                        break
                    feed(more)
            facts = reader.facts
            now = time.monotonic()
            if log_ended and lost.due(now):
                # The stream ended: the workload exited, or the runtime went away (or both).
                try:
                    event = runtime.wait(workload.id, timeout=1 if lost.active else 10)
                except PodmanUnreachable as exc:
                    if not lost.active:
                        self.log.warning("runtime_unreachable", error=exc.message, container_id=workload.id)
                        with self.lock:
                            self.view.message = f"Podman unreachable since {time.strftime('%H:%M:%S')}: {exc.message}"
                    lost.failed(now, RestartSettings.from_settings(settings))
                else:
                    if event is not None:
                        return self._ended(runtime, workload, event, facts, ready)
                    if lost.active:
                        self.log.info("runtime_reconnected", container_id=workload.id, after_seconds=lost.seconds(now))
                        with self.lock:
                            self.view.message = None
                    lost.clear()
                    log_ended = False
                    pump = LogPump(runtime, workload.id, self.name, self.log, skip=fed)
                    self._lines = pump.lines
            if facts.failure is not None and facts.failure != "engine_dead" and not ready:
                # vLLM exits after these; give it a moment, then make sure.
                ended = runtime.wait(workload.id, timeout=10)
                if ended is None:
                    runtime.stop(workload.id, settings.stop_timeout_seconds)
                runtime.remove(workload.id)
                return Outcome("failure", FailureCause.from_log(facts.failure), facts.failure_message, facts)
            if not ready:
                if now > deadline:
                    self.log.warning("boot_timeout", seconds=settings.boot_timeout_seconds)
                    runtime.stop(workload.id, settings.stop_timeout_seconds)
                    runtime.remove(workload.id)
                    return Outcome(
                        "failure",
                        FailureCause.BOOT_TIMEOUT,
                        f"not ready within {settings.boot_timeout_seconds:.0f}s",
                        facts,
                    )
                # Poll fast once vLLM says the server is up; slowly otherwise (the port is closed).
                if facts.ready or now >= next_health:
                    next_health = now + 1.0
                    if check_health(dep.host, dep.port, timeout=1.0).healthy:
                        ready = True
                        self._became_ready(plan, boot_key, facts, baseline, learned_used)
                        if slot is not None:
                            slot.release()  # ready and saved: the next boot on these GPUs may profile now
                        next_health = now + settings.health_interval_seconds
                continue
            if now >= next_health:
                next_health = now + settings.health_interval_seconds
                result = check_health(dep.host, dep.port, timeout=min(2.0, settings.health_interval_seconds))
                if result.healthy:
                    unhealthy = 0
                elif result.own_error:  # out of descriptors or memory here: says nothing about the server
                    self.log.warning("health_probe_not_sent", error=result.error)
                else:
                    unhealthy += 1
                    self.log.warning("health_failed", status=result.status, error=result.error, count=unhealthy)
                    # 503 is vLLM's own "engine dead"; no answer twice in a row counts the same.
                    if result.status == 503 or unhealthy >= 2:
                        runtime.stop(workload.id, settings.stop_timeout_seconds)
                        runtime.remove(workload.id)
                        return Outcome(
                            "ready_then_failed",
                            FailureCause.ENGINE_DEAD,
                            facts.failure_message or f"health check failed ({result.status or result.error})",
                            facts,
                        )

    def _ended(self, runtime: Runtime, workload: Workload, event: ExitEvent, facts: BootFacts, ready: bool) -> Outcome:
        """The workload exited (its exit event): classify why."""
        code = event.exit_code
        with contextlib.suppress(Exception):
            runtime.remove(workload.id)
        if facts.failure is not None:
            cause = FailureCause.from_log(facts.failure)
        elif ready:
            cause = FailureCause.ENGINE_DEAD
        elif code == 2:
            cause = FailureCause.BAD_ARGUMENT
        else:
            cause = FailureCause.CRASH
        message = facts.failure_message or f"vLLM exited with code {code}"
        if event.oom_killed:
            message += " (killed by the kernel's OOM killer: host RAM)"
        return Outcome("ready_then_failed" if ready else "failure", cause, message, facts)

    def _on_boot_event(self, event: Any, facts: BootFacts) -> None:
        reported = _phase_of(event)
        with self.lock:
            current = self.view.phase
            self.view.weights_percent = getattr(facts, "weights_percent", None)
            self.view.compile_cache_hit = facts.compile_cache_hit
            self.view.compile_seconds = facts.compile_seconds
            self.view.preemptions = facts.preemptions
            self.view.kv_cache_usage_perc = getattr(facts, "kv_cache_usage_perc", None)
            if facts.vllm_version:
                self.view.vllm_version = facts.vllm_version
        if reported is not None:
            new = advance_boot_phase(current, reported)
            if new is not current and new is not Phase.READY:
                self._set(phase=new)

    def _became_ready(
        self,
        plan: Plan,
        boot_key: str,
        facts: BootFacts,
        baseline: Sequence[int] | None,
        learned_used: int | None,
    ) -> None:
        state = self.daemon.state
        kv_bytes = learned_used if learned_used is not None else facts.kv_cache_memory_bytes
        # Saved and logged before `ready` is visible: whoever sees ready finds the boot (and what it taught)
        # on disk and the `ready` event in the log.
        state.record_boot(self.name, facts, kv_bytes, learned_used is not None)
        if learned_used is None and baseline:
            learned = learning.learn_from_boot(facts, baseline, time.time())
            if learned is not None and state.learned(self.name, boot_key) is None:
                state.remember_learned(self.name, boot_key, learned)
                self.log.info("kv_cache_learned", kv_cache_memory_bytes=learned.kv_cache_memory_bytes)
        took = None if self._boot_started is None else round(time.monotonic() - self._boot_started, 3)
        self.log.info(
            "ready",
            endpoint=self.view.endpoint,
            boot_seconds=took,
            kv_cache_memory_bytes=kv_bytes,
            learned_used=learned_used is not None,
            compile_cache_hit=facts.compile_cache_hit,
        )
        self._set(
            phase=Phase.READY,
            state="ready",
            ready_since=time.time(),
            kv_cache_memory_bytes=kv_bytes,
            compile_cache_hit=facts.compile_cache_hit,
            compile_seconds=facts.compile_seconds,
        )


def _phase_of(event: Any) -> Phase | None:
    """The lifecycle phase a boot-log event reports, if any."""
    if isinstance(event, PhaseChanged):
        return Phase(event.phase.value)
    return None


def _assigned(host: Host, uuids: tuple[str, ...]) -> list[Any]:
    by_uuid = {g.uuid: g for g in host.gpus}
    return [by_uuid[u] for u in uuids if u in by_uuid]


def _free_in_order(readings: Mapping[str, GpuMemory], uuids: tuple[str, ...]) -> list[int]:
    """Free bytes per assigned GPU in assignment order (unknown counts as none free)."""
    out = []
    for uuid in uuids:
        reading = readings.get(uuid)
        out.append(reading.free_bytes if reading is not None and reading.free_bytes is not None else 0)
    return out


def _flag_float(argv: tuple[str, ...], flag: str) -> float | None:
    if flag in argv:
        index = argv.index(flag)
        if index + 1 < len(argv):
            try:
                return float(argv[index + 1])
            except ValueError:
                return None
    return None


def _overrides_from(values: Mapping[str, int | float | str]) -> BootOverrides:
    return BootOverrides(**_override_fields(values))


def _override_fields(values: Mapping[str, int | float | str]) -> dict[str, Any]:
    """The BootOverrides fields a policy remediation changes (unknown keys ignored)."""
    out: dict[str, Any] = {}
    if "max_model_len" in values:
        out["max_model_len"] = values["max_model_len"]
    if "gpu_memory_utilization" in values:
        out["gpu_memory_utilization"] = float(values["gpu_memory_utilization"])
    return out


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
        self.host: Host = deps.load_host()
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._ready_sent = False
        self._lock = threading.Lock()
        self._claimed_slots: dict[str, BootSlot] = {}
        self.reload_error: dict[str, Any] | None = None
        """The last reload's refusal (the running config stayed), None once a reload succeeds."""

    # -- called by workers -------------------------------------------------------------------
    def phase_changed(self) -> None:
        self._changed.set()

    def take_claimed_slot(self, name: str) -> BootSlot | None:
        """The boot slot claimed at start-up for the deployment's running workload (once), if any."""
        with self._lock:
            return self._claimed_slots.pop(name, None)

    def gpu_memory(self, uuids: tuple[str, ...]) -> dict[str, GpuMemory]:
        return read_gpu_memory(uuids, self.deps.hardware_file, self.host)

    def utilization_band_top(self, name: str) -> float | None:
        """The top of the utilisation table band of the deployment's smallest GPU."""
        from dankserve.plan.rules import smallest_gpu, utilisation_row

        worker = self.workers.get(name)
        uuids = worker.view.gpu_uuids if worker else ()
        gpus = [g for g in self.host.gpus if g.uuid in uuids]
        return utilisation_row(smallest_gpu(gpus)).top if gpus else None

    def other_gpu_processes(self, uuids: tuple[str, ...]) -> bool:
        """NVML lists compute processes on these GPUs (ours are stopped when this is asked)."""
        readings = self.gpu_memory(uuids)
        return any((r.other_processes or 0) > 0 for r in readings.values())

    # -- lifecycle ---------------------------------------------------------------------------
    def run(self) -> ExitCode:
        """Run until SIGTERM/SIGINT; the exit code for the process."""
        held = instance.acquire(self.settings.state_dir)
        control = ControlServer(socket_path(self.settings.state_dir), self.handle_request)
        previous = self._install_signals()
        close_services: Callable[[], None] = lambda: None  # noqa: E731
        try:
            try:
                control.start()
            except OSError as exc:
                raise EnvironmentUnusable(
                    f"cannot listen on the control socket {control.path}: {exc.strerror or exc}",
                    fix="make the state dir writable (the state_dir setting or DANKSERVE_STATE_DIR names it)",
                ) from None
            if self.deps.services is not None:
                close_services = self.deps.services(self)
            starting = {n: d for n, d in self.settings.deployments.items() if d.enabled and not self.state.is_down(n)}
            self._claim_running_boots(starting)
            for name, dep in starting.items():
                self._start_worker(name, dep)
            if not self.workers:
                log.info("no_deployments", hint="configure [deployments.NAME] or `dankserve up NAME`")
            self._main_loop()
            return ExitCode.OK
        finally:
            self.notifier.stopping()
            self._stop_all()
            close_services()
            control.close()
            self.state.flush()
            held.release()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            log.info("daemon_stopped")

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
                overrides = _overrides_from(self.state.deployment(name).overrides)
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

    def request_reload(self) -> None:
        self._reload.set()
        self._changed.set()

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

    def _start_worker(self, name: str, dep: DeploymentSettings) -> None:
        worker = DeploymentWorker(name, dep, self)
        self.workers[name] = worker
        worker.start()

    def _main_loop(self) -> None:
        watchdog = watchdog_interval()
        notify = self.notifier
        next_watchdog = 0.0
        next_extend = 0.0
        last_status = ""
        while not self._stop.is_set():
            self._changed.wait(0.25)
            self._changed.clear()
            if self._reload.is_set():
                self._reload.clear()
                self._apply_reload()
            phases = {name: w.phase for name, w in self.workers.items()}
            percents = {name: w.view.weights_percent for name, w in self.workers.items()}
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
                if all(w.alive or w.phase in (Phase.FAILED, Phase.STOPPED) for w in self.workers.values()):
                    notify.watchdog()
                next_watchdog = now + watchdog / 2

    def _stop_all(self) -> None:
        for worker in self.workers.values():
            worker.request_stop()
        deadline = time.monotonic() + self.settings.stop_timeout_seconds + 15
        for worker in self.workers.values():
            worker.join(max(0.1, deadline - time.monotonic()))

    def _apply_reload(self) -> None:
        from dankserve.settings import load_settings

        try:
            new = load_settings(self._config_path)
        except Exception as exc:  # any failure keeps the running config and deployments
            error = exc.render() if isinstance(exc, DankserveError) else f"internal error: {type(exc).__name__}: {exc}"
            log.error("reload_rejected", error=error, keeping="the running configuration")
            self.reload_error = {"error": error, "at": time.time()}
            return
        self.reload_error = None
        old = self.settings
        self.settings = new
        for name, worker in list(self.workers.items()):
            dep = new.deployments.get(name)
            if dep is None or not dep.enabled:
                log.info("reload_stop", deployment=name)
                worker.request_stop()
                worker.join(new.stop_timeout_seconds + 15)
                del self.workers[name]
            elif dep != old.deployments.get(name):
                log.info("reload_replan", deployment=name)
                if worker.alive:
                    worker.request_replan(dep)
                else:
                    self._start_worker(name, dep)
        for name, dep in new.deployments.items():
            if name not in self.workers and dep.enabled and not self.state.is_down(name):
                log.info("reload_start", deployment=name)
                self._start_worker(name, dep)

    # -- control requests --------------------------------------------------------------------
    def handle_request(self, request: Mapping[str, Any]) -> dict[str, Any]:
        command = request.get("command")
        name = request.get("deployment")
        if command == "status":
            return {"ok": True, "status": self.status()}
        if command == "reload":
            self.request_reload()
            return {"ok": True}
        if command in ("up", "down"):
            if not isinstance(name, str) or name not in self.settings.deployments:
                known = ", ".join(sorted(self.settings.deployments)) or "none"
                return {"ok": False, "error": f"unknown deployment {name!r} (configured: {known})"}
            with self._lock:
                if command == "down":
                    self.state.set_down(name, True)
                    worker = self.workers.pop(name, None)
                    if worker is not None:
                        worker.request_stop()
                        worker.join(self.settings.stop_timeout_seconds + 15)
                    return {"ok": True}
                self.state.set_down(name, False)
                existing = self.workers.get(name)
                if existing is None or not existing.alive:
                    self._start_worker(name, self.settings.deployments[name])
                return {"ok": True}
        return {"ok": False, "error": f"unknown command {command!r}"}

    def status(self) -> dict[str, Any]:
        """The `status --json` document while the daemon runs."""
        import os

        deployments = []
        for name in sorted(self.settings.deployments):
            worker = self.workers.get(name)
            deployments.append(self._deployment_status(name, worker))
        daemon: dict[str, Any] = {"running": True, "pid": os.getpid()}
        warnings = []
        if self.reload_error is not None:
            daemon["reload_error"] = self.reload_error
            warnings.append(
                f"the last reload was refused, the running configuration stays: {self.reload_error['error']}"
            )
        return {"daemon": daemon, "deployments": deployments, "warnings": warnings}

    def _deployment_status(self, name: str, worker: DeploymentWorker | None) -> dict[str, Any]:
        dep = self.settings.deployments[name]
        record = self.state.deployment(name)
        if worker is None:
            view = DeploymentView(name, dep.model, dep.image, f"http://{dep.host}:{dep.port}/v1")
            view.state = "down" if self.state.is_down(name) else "stopped"
        else:
            with worker.lock:
                view = replace(worker.view)
        gpus = []
        if view.gpu_uuids:
            for reading in self.gpu_memory(view.gpu_uuids).values():
                gpus.append(
                    {
                        "index": reading.index,
                        "memory_used_bytes": reading.used_bytes,
                        "memory_total_bytes": reading.total_bytes,
                    }
                )
        preemptions = view.preemptions
        usage = view.kv_cache_usage_perc
        if view.phase is Phase.READY:
            text = fetch_metrics(dep.host, dep.port, timeout=0.5)
            if text is not None:
                value = metric_value(text, "vllm:num_preemptions_total")
                preemptions = int(value) if value is not None else preemptions
                usage_value = metric_value(text, "vllm:kv_cache_usage_perc")
                usage = usage_value if usage_value is not None else usage
        return {
            "name": name,
            "state": view.state,
            "phase": view.phase.value,
            "endpoint": view.endpoint,
            "model": view.model,
            "image": view.image,
            "vllm_version": view.vllm_version,
            "uptime_seconds": None if view.ready_since is None else round(time.time() - view.ready_since, 1),
            "boots": max(view.boots, record.boots),
            "restarts": max(view.restarts, record.restarts),
            "last_failure": view.last_failure or failure_json(record.last_failure),
            "kv_cache_memory_bytes": view.kv_cache_memory_bytes,
            "kv_cache_learned_used": view.kv_cache_learned_used,
            "compile_cache_hit": view.compile_cache_hit,
            "gpus": gpus,
            "kv_cache_usage_perc": usage,
            "preemptions": preemptions,
            "message": view.message,
            **self._hosts_status(name),
        }

    def _hosts_status(self, name: str) -> dict[str, Any]:
        hosts = self.deps.describe_hosts(name) if self.deps.describe_hosts is not None else None
        return {} if hosts is None else {"hosts": hosts}
