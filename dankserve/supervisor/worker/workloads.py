"""The workloads one worker has seen: the runtime each one runs on, and the log of the one it follows.

A reload may change a deployment's runtime, never an old workload's: each workload is stopped and
removed through the runtime that started (or found) it. Only the current follower's lines are read:
a stream of an earlier workload, or one opened again, is numbered and its lines dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dankserve.bootlog import BootLogReader, PhaseChanged
from dankserve.runtime.base import Runtime
from dankserve.settings import DeploymentSettings
from dankserve.supervisor import machine as m
from dankserve.supervisor.lifecycle import Phase
from dankserve.supervisor.worker.log_pump import Inbox, Line, LogPump


class WorkloadRuntimes:
    """The runtime of each workload seen (the deployment's current runtime for one not seen)."""

    def __init__(self, runtime_for: Callable[[DeploymentSettings], Runtime]) -> None:
        self._runtime_for = runtime_for
        self._runtimes: dict[str, Runtime] = {}

    def of(self, workload_id: str, dep: DeploymentSettings) -> Runtime:
        return self._runtimes.get(workload_id) or self._runtime_for(dep)

    def current(self, dep: DeploymentSettings) -> Runtime:
        """The runtime a new workload of `dep` starts on."""
        return self._runtime_for(dep)

    def seen(self, workload_id: str, runtime: Runtime) -> None:
        self._runtimes[workload_id] = runtime

    def forget(self, workload_id: str) -> None:
        self._runtimes.pop(workload_id, None)


class LogFollow:
    """The current workload's log: who follows it, how far it was read, and the boot facts read from it."""

    def __init__(self, name: str, inbox: Inbox, logger: Any) -> None:
        self._name = name
        self._inbox = inbox
        self._log = logger
        self._reader = BootLogReader()
        self._fed = 0  # lines of the current workload's log read so far (a resumed stream skips them)
        self._follower = 0  # the current log follower's number: lines of older ones are dropped
        self._following: str | None = None

    def follow(self, runtime: Runtime, workload_id: str, *, resume: bool, server: int | None) -> None:
        if not resume:
            self._reader = BootLogReader()
            self._fed = 0
        self._follower += 1
        self._following = workload_id
        # A multi-host group reports a lost member as an event (a single workload has none).
        runtime.watch_members(lambda reason: self._inbox.put(m.MemberLost(reason)))
        LogPump(
            runtime,
            workload_id,
            self._inbox,
            number=self._follower,
            name=self._name,
            logger=self._log,
            skip=self._fed,
            server=server,
        )

    def unfollow(self, workload_id: str) -> None:
        if self._following == workload_id:
            self._follower += 1  # what the old follower still sends is dropped
            self._following = None

    def events(self, item: Line) -> list[m.Event]:
        """What a line means to the machine: the end of the log, phase changes, new facts (nothing for a line
        of an earlier follower)."""
        if item.follower != self._follower:
            return []  # a follower of an earlier workload, or of a stream opened again
        if item.text is None:
            return [m.LogEnded()]
        self._fed += 1
        before = self._reader.facts
        phases = [Phase(e.phase.value) for e in self._reader.feed(item.text) if isinstance(e, PhaseChanged)]
        facts = self._reader.facts
        events: list[m.Event] = [m.BootLog(facts, phase) for phase in phases]
        if not phases and facts != before:  # a fact without a phase change (the version, a failure ...)
            events.append(m.BootLog(facts))
        return events
