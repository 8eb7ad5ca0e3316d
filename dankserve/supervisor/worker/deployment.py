"""`DeploymentWorker`: keeps one deployment serving in its own thread, an interpreter of the lifecycle
machine. It feeds events (its inbox: log lines, probes, control requests) into `machine.step`, runs
the commands that come back (`commands.Commands`) and publishes the new state for status, the
gateway and the swap groups. Every decision is the machine's.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Sequence

import structlog

from dankserve.errors import DankserveError, resources_exhausted
from dankserve.plan.serve_args import served_name
from dankserve.planning import backend_address
from dankserve.settings import DeploymentSettings, Settings
from dankserve.supervisor import machine as m
from dankserve.supervisor.fleet.swap_verify import workload_pids
from dankserve.supervisor.lifecycle import BOOTING_PHASES, Phase
from dankserve.supervisor.machine import BootOverrides
from dankserve.supervisor.policy import FailureCause, RestartSettings
from dankserve.supervisor.probes.liveness import LivenessSettings
from dankserve.supervisor.probes.liveness_probe import LivenessMonitor
from dankserve.supervisor.worker.commands import Commands
from dankserve.supervisor.worker.log_pump import Inbox, Line
from dankserve.supervisor.worker.services import WorkerServices

log = structlog.get_logger("dankserve")

STOP_COMMANDS = (m.StopWorkload, m.RemoveWorkload, m.StopServer, m.RemoveLauncher)
STOP_RETRY_SECONDS = 10.0
"""How long a stop refused for the daemon's own want of descriptors or memory is tried again."""
STOP_RETRY_PAUSE_SECONDS = 0.2

_INSTANT = (
    *(m.Note, m.RecordFailure, m.RecordRestart, m.RecordBoot, m.ForgetLearned, m.SetRemediation, m.ReleaseGpus),
    m.MarkSleepUnsafe,
)
"""Commands that never wait and never answer: run before the new state is published."""


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

    def __init__(
        self, name: str, dep: DeploymentSettings, services: WorkerServices, *, join_asleep: bool = False
    ) -> None:
        self.name = name
        self._join_asleep = join_asleep  # a swap member added by a reload to a running group: no first boot
        self._services = services
        self.dep = dep = self._as_run(dep)
        self.lock = threading.Lock()
        self.clock = services.world.clock
        remembered = services.world.state.deployment(name)
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
        self._commands = Commands(
            name,
            services,
            self._inbox,
            machine=lambda: self.machine,
            stopping=self._stopping,
            keep_launcher=lambda: self._keep_launcher,
            progress=self._progress,
            logger=self.log,
        )
        self._alive: LivenessMonitor | None = None  # beyond /health, while ready
        services.telemetry.track(name)
        self._phase_since = self.clock.monotonic()

    def _as_run(self, dep: DeploymentSettings) -> DeploymentSettings:
        """The configured settings with the image an upgrade switched the deployment to (state.json keeps it)."""
        return self._services.world.state.as_run(self.name, dep)

    def _config(self, dep: DeploymentSettings) -> m.MachineConfig:
        download = self._services.world.fetch_weights is not None
        return machine_config(self._services.world.settings, dep, download_weights=download)

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
        dep = self._as_run(dep)
        with self.lock:
            self.dep = dep

    def request_replan(self, dep: DeploymentSettings, handover: str | None = None) -> None:
        """Apply a changed configuration (or a switched image): the next boot uses it. `handover`: a running
        workload of that configuration (an upgrade's trial server) the next boot adopts instead of starting one."""
        dep = self._as_run(dep)
        with self.lock:
            self.dep = dep
        self._commands.boots.handover = handover
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

    @property
    def max_num_seqs(self) -> int | None:
        """The last plan's --max-num-seqs (None before a plan, or none in it)."""
        return self._commands.boots.max_num_seqs

    def server_pids(self) -> list[int]:
        """The host pids of the current server's processes (none without one, or when the runtime does not
        answer): what its GPU memory is read by (`dankserve status`)."""
        workload_id = self.machine.workload_id
        if workload_id is None:
            return []
        with self.lock:
            dep = self.dep
        return workload_pids(self._commands.runtimes.of(workload_id, dep), workload_id)

    @property
    def waiting_for(self) -> str | None:
        """What the current boot waits for before it may take its GPUs (None: it does not wait)."""
        return self._commands.boots.waiting_for

    @property
    def phase_since(self) -> float:
        """When (the worker's monotonic clock) the current phase began."""
        with self.lock:
            return self._phase_since

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
                for event in self._commands.logs.events(item):
                    self._feed(event)
            else:
                self._feed(item)
            self._watch_liveness()
        self._commands.boots.release()

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
        services = self._services
        settings = services.world.settings
        with self.lock:
            dep = self.dep
        return LivenessMonitor(
            name=self.name,
            workload_id=workload_id,
            address=backend_address(settings, self.name, dep),
            model=served_name(dep.served_model_name, dep.extra_args, dep.model),
            api_key_file=dep.api_key_file,
            settings=LivenessSettings(settings.stall_seconds, settings.liveness_interval_seconds),
            timeout=settings.liveness_timeout_seconds,
            sample=lambda: services.observatory.sample(self.name),
            telemetry=services.telemetry,
            now=now,
            wall=self.clock.time,
        )

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
        self._commands.records.published(before, after)
        with self.lock:
            self._machine = after
            if after.phase is not before.phase:
                self._phase_since = self.clock.monotonic()
        if after.phase is not before.phase:
            self.log.info("phase", phase=after.phase.value)
            self._services.phase_changed()

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
                self._services.stop_failed(self.name)
                return event
            time.sleep(STOP_RETRY_PAUSE_SECONDS)

    def _execute_once(self, command: m.Command) -> m.Event | None:
        try:
            with self.lock:  # launcher = "auto" decides by the image's entrypoint, read when it was ensured
                dep = self.dep.with_image_entrypoint(self._machine.image_entrypoint)
            return self._commands.run(command, dep)
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

    def _progress(self, percent: int) -> None:
        """A download's progress, stepped at once from the downloader's thread (it only updates the percentage)."""
        self._feed(m.WeightsProgress(percent))
