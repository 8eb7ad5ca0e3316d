"""A worker's records: the commands that only write the state file and telemetry (failures, restarts,
boots and what they taught, remediations), and each boot's, wake's and sleep's time against its
prediction. Telemetry is written before the state file, so a status taken meanwhile never shows a
restart without its cause."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dankserve.supervisor import learning
from dankserve.supervisor import machine as m
from dankserve.supervisor.observe import prediction
from dankserve.supervisor.observe.telemetry import boot_kind
from dankserve.supervisor.policy import FailureCause
from dankserve.supervisor.worker.services import WorkerServices


class Recorder:
    """Writes one deployment's records."""

    def __init__(self, name: str, services: WorkerServices, machine: Callable[[], m.MachineState], logger: Any) -> None:
        self._name = name
        self._services = services
        self._machine = machine
        self._log = logger
        self._last_cause: str | None = None  # the failure a RecordRestart that follows restarts after

    def record(self, command: m.Command) -> None:
        """The commands that only write the state file."""
        services, name = self._services, self._name
        match command:
            case m.RecordFailure(cause=cause, message=message):
                services.telemetry.failed(name, cause)
                services.world.state.record_failure(name, cause, message, services.world.clock.time())
                self._last_cause = cause
            case m.RecordRestart():
                services.telemetry.restarted(name, self._last_cause or FailureCause.OTHER.value)
                services.world.state.record_restart(name)
            case m.RecordBoot():
                self._record_boot(command)
            case m.ForgetLearned(boot_key=key):
                services.world.state.forget_learned(name, key)
            case m.SetRemediation(overrides=values, remediated=causes):
                services.world.state.set_remediation(name, dict(values), causes)

    def published(self, before: m.MachineState, after: m.MachineState) -> None:
        """Before status shows `after`: a swap's timing, and the sleep record (to outlive a kill -9)."""
        done = after.swap
        ended = (done.last_at, done.last_kind) != (before.swap.last_at, before.swap.last_kind)
        if ended and done.last_kind is not None:
            took = done.last_sleep_seconds if done.last_kind == "sleep" else done.last_wake_seconds
            if took is not None:
                self._services.telemetry.swapped(self._name, done.last_kind, took)
                dep = self._services.world.settings.deployments.get(self._name)
                self._services.telemetry.swaps.ended(
                    self._name,
                    done.last_kind,
                    done.last_level,
                    took,
                    group=dep.swap_group if dep is not None else None,
                    at=self._services.world.clock.time(),
                )
                self._timed(done.last_kind, took)
        record = after.sleep_record
        if record != before.sleep_record:  # written before status shows it (and /sleep is sent)
            self._services.world.state.set_asleep(
                self._name,
                record.level if record is not None else None,
                record.moving if record is not None else None,
            )

    def _record_boot(self, command: m.RecordBoot) -> None:
        services, name = self._services, self._name
        state = services.world.state
        machine = self._machine()
        boot = machine.boot
        adopted = boot is not None and boot.adopted
        took: float | None = None
        kind: str | None = None
        if boot is not None and not boot.adopted:  # an adopted boot's start was not seen: no duration, no kind
            took = round((boot.ready_at or services.world.clock.monotonic()) - boot.started_at, 3)  # as it turns ready
            kind = boot_kind(
                compile_cache_hit=command.facts.compile_cache_hit,
                learned_bytes_used=command.learned_used,
                wake=machine.swap.since is not None,  # a swap group member woken by booting
                restore=command.restored,
            )
        state.record_boot(
            name, command.facts, command.kv_bytes, command.learned_used, adopted=adopted, seconds=took, kind=kind
        )
        if boot is not None and took is not None and kind is not None:
            services.telemetry.booted(name, kind, took, command.facts.compile_cache_hit)
            if kind != "wake":  # a wake by booting is timed as the wake it is (`published`)
                self._timed(prediction.timing_kind(kind), took)
        services.observatory.poke()
        if command.baseline and command.boot_key is not None:
            learned = learning.learn_from_boot(command.facts, command.baseline, services.world.clock.time())
            if learned is not None and state.learned(name, command.boot_key) is None:
                state.remember_learned(name, command.boot_key, learned)
                self._log.info("kv_cache_learned", kv_cache_memory_bytes=learned.kv_cache_memory_bytes)

    def _timed(self, kind: str, seconds: float) -> None:
        """A boot, wake or sleep took `seconds`: compared with its prediction (before it joins the history)."""
        services = self._services
        expected = prediction.predict(services.world.state.deployment(self._name).timings).of(kind)
        if kind != "sleep" and prediction.slower_than_predicted(seconds, expected):
            self._log.warning("slower_than_predicted", kind=kind, seconds=seconds, predicted_seconds=expected)
            services.telemetry.slower_than_predicted(self._name, kind)
        services.world.state.record_timing(self._name, kind, seconds)
