"""What the daemon tells systemd at each turn of its main loop: the status line when it changes,
READY=1 once every deployment settled the first time, EXTEND_TIMEOUT while the first boots still run
(long boots would outlast the unit's start timeout), and WATCHDOG=1 while every worker is alive or
ended for good."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import structlog

from dankserve.supervisor import machine as m
from dankserve.supervisor.lifecycle import Phase, all_settled, status_line

log = structlog.get_logger("dankserve")

EXTEND_SECONDS = 60
"""How much longer each EXTEND_TIMEOUT gives the start; sent every EXTEND_EVERY_SECONDS."""
EXTEND_EVERY_SECONDS = 20.0


class Notifier(Protocol):
    """What is sent to systemd (`systemd.notify.SystemdNotifier`); each answers whether it was sent."""

    def status(self, text: str) -> bool: ...

    def ready(self, status: str | None = None) -> bool: ...

    def extend_timeout(self, usec: int) -> bool: ...

    def watchdog(self) -> bool: ...

    def resend_dropped(self) -> bool: ...


class Reporting(Protocol):
    """What is read of a deployment's worker (`worker.DeploymentWorker`)."""

    @property
    def phase(self) -> Phase: ...

    @property
    def machine(self) -> m.MachineState: ...

    @property
    def alive(self) -> bool: ...


class Readiness:
    """The daemon's notifications to systemd, one `report` per main-loop turn."""

    def __init__(self, notifier: Notifier, watchdog: float | None) -> None:
        self._notify = notifier
        self._watchdog = watchdog
        self._next_watchdog = 0.0
        self._next_extend = 0.0
        self._last_status = ""
        self.ready_sent = False

    def wait_seconds(self, now: float) -> float:
        """How long the main loop may wait before the next turn (the watchdog's next ping bounds it)."""
        return 0.25 if self._watchdog is None else max(0.0, min(0.25, self._next_watchdog - now))

    def report(self, workers: Mapping[str, Reporting], now: float) -> None:
        notify = self._notify
        notify.resend_dropped()  # what a full queue dropped (never waited for: the send does not block)
        phases = {name: w.phase for name, w in workers.items()}
        percents = {name: w.machine.weights_percent for name, w in workers.items()}
        text = status_line(phases, percents).text
        if text != self._last_status:
            notify.status(text)
            self._last_status = text
        if not self.ready_sent and all_settled(phases):
            notify.ready()
            self.ready_sent = True
            log.info("daemon_ready", deployments=len(phases))
        if not self.ready_sent and now >= self._next_extend:
            # Long first boots: keep extending systemd's start timeout while we make progress.
            notify.extend_timeout(int(EXTEND_SECONDS * 1e6))
            self._next_extend = now + EXTEND_EVERY_SECONDS
        if self._watchdog is not None and now >= self._next_watchdog:
            if all(w.alive or w.phase in (Phase.FAILED, Phase.STOPPED) for w in workers.values()):
                notify.watchdog()
            self._next_watchdog = now + self._watchdog / 2
