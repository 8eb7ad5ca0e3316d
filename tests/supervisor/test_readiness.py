"""Tests for dankserve.supervisor.readiness: what the main loop tells systemd, over stand-in workers."""

from __future__ import annotations

from dataclasses import dataclass, field

from dankserve.supervisor import machine as m
from dankserve.supervisor.lifecycle import Phase
from dankserve.supervisor.policy import RestartSettings
from dankserve.supervisor.readiness import Readiness

CONFIG = m.MachineConfig(RestartSettings(1, 1, 1, 0, 1, 1))


@dataclass
class Notes:
    """A notifier that records what it was asked to send."""

    sent: list[str] = field(default_factory=list)

    def status(self, text: str) -> bool:
        self.sent.append(f"STATUS={text}")
        return True

    def ready(self, status: str | None = None) -> bool:
        self.sent.append("READY=1")
        return True

    def extend_timeout(self, usec: int) -> bool:
        self.sent.append(f"EXTEND_TIMEOUT_USEC={usec}")
        return True

    def watchdog(self) -> bool:
        self.sent.append("WATCHDOG=1")
        return True

    def resend_dropped(self) -> bool:
        return True


@dataclass
class Worker:
    stage: m.Stage
    alive: bool = True

    @property
    def machine(self) -> m.MachineState:
        return m.MachineState(CONFIG, stage=self.stage)

    @property
    def phase(self) -> Phase:
        return self.machine.phase


def test_ready_is_sent_once_when_every_deployment_settled_and_the_start_is_extended_before() -> None:
    """While a boot runs, EXTEND_TIMEOUT (at most every 20 s); READY=1 once all are ready, never again."""
    notes = Notes()
    readiness = Readiness(notes, None)
    workers = {"a": Worker(m.Stage.BOOTING), "b": Worker(m.Stage.READY)}
    readiness.report(workers, 0.0)
    readiness.report(workers, 5.0)
    assert notes.sent.count("EXTEND_TIMEOUT_USEC=60000000") == 1 and "READY=1" not in notes.sent
    workers["a"] = Worker(m.Stage.READY)
    readiness.report(workers, 6.0)
    readiness.report(workers, 30.0)
    assert notes.sent.count("READY=1") == 1 and readiness.ready_sent
    assert notes.sent.count("EXTEND_TIMEOUT_USEC=60000000") == 1, "no extension once ready"


def test_the_status_line_is_sent_only_when_it_changes() -> None:
    """The same phases twice send STATUS= once."""
    notes = Notes()
    readiness = Readiness(notes, None)
    workers = {"a": Worker(m.Stage.READY)}
    readiness.report(workers, 0.0)
    readiness.report(workers, 1.0)
    assert [n for n in notes.sent if n.startswith("STATUS=")] == ["STATUS=a: ready"]


def test_the_watchdog_is_fed_only_while_every_worker_is_alive_or_ended_for_good() -> None:
    """A worker thread that died while booting stops WATCHDOG=1 (systemd restarts the daemon); a failed one does not."""
    notes = Notes()
    readiness = Readiness(notes, 1.0)
    readiness.report({"a": Worker(m.Stage.FAILED, alive=False)}, 0.0)
    assert notes.sent.count("WATCHDOG=1") == 1
    readiness.report({"a": Worker(m.Stage.BOOTING, alive=False)}, 1.0)
    assert notes.sent.count("WATCHDOG=1") == 1
    assert readiness.wait_seconds(1.0) <= 0.25
