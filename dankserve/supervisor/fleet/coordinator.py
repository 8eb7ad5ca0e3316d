"""The fleet coordinator (issue 40 item 2): the one author of sleep and wake.

One thread takes intents from its inbox (a wake from the gateway or `dankserve wake`, a sleep from
`dankserve sleep` or an upgrade, a boot asking for room, an upgrade's hold), and a look around whenever
a phase changes and at least every LOOK_SECONDS of the injected clock; it hands each to the pure
`coordinate.coordinate` with a `FleetView` of the workers now, keeps the state it returns, and executes
its directives: `SleepRequested`/`WakeRequested` fed to a worker, a boot admitted or told why it waits,
a request answered. Whatever the gateway link and `status` read (draining, held_for, refused,
idle_sleep_in) is answered from the latest state; requests in flight per member are the roster's.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from dankserve.plan.catalogue import capabilities
from dankserve.plan.sleep_mode import SLEEP_MODE_FLAG
from dankserve.supervisor import machine as m
from dankserve.supervisor.clock import Clock
from dankserve.supervisor.fleet import coordinate as c
from dankserve.supervisor.fleet import swap, swap_suspend
from dankserve.supervisor.fleet.swap_checks import CUDA_CONTEXT_BYTES, safe_choice
from dankserve.supervisor.fleet.swap_fit import fit_facts, sleeps_after_first_boot
from dankserve.supervisor.fleet.swap_roster import (
    PlanFacts,
    Roster,
    SwapFleet,
    SwapMember,
    member_state,
    utilization,
)
from dankserve.supervisor.fleet.swap_suspend import SuspendReadings

__all__ = ["FleetCoordinator", "PlanFacts", "SwapFleet", "SwapMember"]

log = structlog.get_logger("dankserve.swap")

LOOK_SECONDS = 0.25
"""The coordinator looks around at least this often (on the injected clock)."""
ANSWER_SECONDS = 30.0
"""How long a request waits for the coordinator's answer before it gives up (a coordinator gone)."""


@dataclass
class _Request:
    """One request in flight: its answer, and (a boot) whom to tell why it waits."""

    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None
    waits: Callable[[str], None] = lambda why: None


class FleetCoordinator:
    """Coordinates the deployments of one daemon: swap groups' sleeps, wakes and boots, and upgrades' holds."""

    def __init__(
        self,
        fleet: SwapFleet,
        available_ram: Callable[[], int | None],
        clock: Clock,
        suspend: SuspendReadings | None = None,
    ) -> None:
        self._fleet = fleet
        self._suspend = suspend
        self._roster = Roster(fleet)
        self._available_ram = available_ram
        self._clock = clock
        self._state = c.FleetState()
        self._inbox: queue.Queue[c.Intent] = queue.Queue()
        self._tickets = itertools.count(1)
        self._requests: dict[int, _Request] = {}
        self._guard = threading.Lock()  # the requests table (callers' threads and the coordinator's)
        self._deciding = threading.Lock()  # one intent at a time (the thread's; a caller's before it starts)
        self._looked = threading.Condition()
        self._poked = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifetime ---------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fleet-coordinator", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._inbox.put(c.Look())
        if self._thread is not None:
            self._thread.join(5)
        with self._guard:
            pending, self._requests = self._requests, {}
        for request in pending.values():
            request.error = "the daemon is stopping"
            request.done.set()

    def poke(self) -> None:
        """Something changed (a phase): look around now."""
        if not self._poked.is_set():
            self._poked.set()
            self._inbox.put(c.Look())

    # -- the thread -------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            intent = self._clock.wait(self._inbox, LOOK_SECONDS)
            if self._stop.is_set():
                return
            if intent is None or isinstance(intent, c.Look):
                self._poked.clear()
            try:
                self.apply(intent or c.Look())
            except Exception:  # a bug here must not end coordinating for good
                log.exception("swap_error")

    def apply(self, intent: c.Intent) -> None:
        """One intent decided and its directives executed (the coordinator's thread; tests call it directly)."""
        with self._deciding:
            view = self._view()
            self._state, directives = c.coordinate(self._state, view, intent, self._clock.monotonic())
            for directive in directives:
                self._execute(directive)
        with self._looked:
            self._looked.notify_all()

    def _view(self) -> c.FleetView:
        fleet = self._fleet
        settings = fleet.settings
        deps = settings.deployments
        groups: dict[str, tuple[str, ...]] = {}
        for name in deps:
            group = self._roster.group_of(name)
            if group is not None and group not in groups:
                groups[group] = tuple(self._roster.names(group))
        members = {}
        for name, worker in fleet.snapshot().items():
            dep = deps.get(name)
            if dep is None:
                continue
            machine = worker.machine
            use = self._roster.use(name)
            cost, resident_until = fit_facts(machine, dep, fleet.state.deployment(name))
            members[name] = c.MemberView(
                name,
                dep.swap_group,
                machine.stage,
                machine.status,
                frozenset(machine.gpu_uuids),
                utilization(self._roster.facts(name), dep.gpu_memory_utilization),
                use[0],
                use[1],
                dep.pinned,
                cost,
                resident_until,
                asleep_by_stop=machine.swap.level == "stop",
                adopted=machine.boot is not None and machine.boot.adopted,
                sleeps_after_first_boot=sleeps_after_first_boot(settings, name),
                idle_sleep_seconds=dep.idle_sleep_seconds,
            )
        gateway = settings.gateway
        return c.FleetView(groups, members, gateway.max_swaps_per_minute if gateway is not None else None)

    def _execute(self, directive: c.Directive) -> None:
        if isinstance(directive, c.FeedSleep):
            self._feed_sleep(directive)
        elif isinstance(directive, c.FeedWake):
            worker = self._fleet.snapshot().get(directive.name)
            if worker is not None:
                worker.feed(m.WakeRequested())
        elif isinstance(directive, c.BootWaits):
            with self._guard:
                request = self._requests.get(directive.ticket)
            if request is not None:
                request.waits(directive.why)
        elif isinstance(directive, c.AdmitBoot | c.Answer):
            with self._guard:
                request = self._requests.pop(directive.ticket, None)
            if request is not None:
                request.error = directive.error if isinstance(directive, c.Answer) else None
                request.done.set()
        else:
            (log.error if directive.error else log.info)(directive.event, **dict(directive.fields))

    def _feed_sleep(self, directive: c.FeedSleep) -> None:
        worker = self._fleet.snapshot().get(directive.name)
        if worker is None:
            return
        if directive.level is not None:
            level, why = directive.level, "chosen by the upgrade"
        else:
            wanted = self.sleep_level(worker.name, worker.machine, waker=directive.waker)
            choice = safe_choice(self._fleet, worker.name, worker.machine, wanted)
            level, why = choice.level.value, choice.reason
        log.info("swap_sleep", deployment=worker.name, sleep_level=level, reason=directive.reason, why=why)
        worker.feed(m.SleepRequested(level, directive.reason))  # type: ignore[arg-type]

    # -- requests (callers' threads) --------------------------------------------------------------
    def _ask(self, make: Callable[[int], c.Intent], request: _Request) -> int:
        ticket = next(self._tickets)
        with self._guard:
            self._requests[ticket] = request
        if self._thread is None:
            self.apply(make(ticket))  # not started (a daemon built but not run: in-process tests): decided here
        else:
            self._inbox.put(make(ticket))
        return ticket

    def wake(self, name: str, by: c.By = "gateway") -> None:
        """Make `name` ready (from the gateway's loop, the control socket or an upgrade: returns at once)."""
        if by == "gateway" and name in self._state.wanted:
            return  # asked already (a burst of requests for a member asleep is one wake)
        self._inbox.put(c.Wake(name, by))

    def sleep(self, name: str, reason: str, by: c.By = "cli", level: m.SleepLevel | None = None) -> str | None:
        """Put a ready deployment to sleep now (`dankserve sleep`, an upgrade); the error text when it cannot."""
        request = _Request()
        self._ask(lambda t: c.Sleep(name, reason, by, t, level), request)
        if not request.done.wait(ANSWER_SECONDS):
            return "the daemon's coordinator did not answer"
        return request.error

    def hold_for_upgrade(self, name: str, gpus: tuple[str, ...]) -> None:
        """An upgrade's trial server of `name` holds `gpus`: nothing else is woken or booted onto them."""
        self._inbox.put(c.UpgradeHold(name, frozenset(gpus)))

    def release_upgrade(self, name: str) -> None:
        self._inbox.put(c.UpgradeRelease(name))

    def admit_boot(
        self,
        name: str,
        uuids: tuple[str, ...],
        cancelled: threading.Event,
        waits: Callable[[str], None] = lambda why: None,
    ) -> bool:
        """Ask for room for `name`'s boot on `uuids` and wait for the answer: True when admitted, False when
        cancelled (or the daemon stops). `waits(why)` is told why while it waits (status shows it)."""
        request = _Request(waits=waits)
        ticket = self._ask(lambda t: c.BootAsked(t, name, uuids), request)
        while not request.done.wait(LOOK_SECONDS):
            if cancelled.is_set() or self._stop.is_set():
                with self._guard:
                    self._requests.pop(ticket, None)
                self._inbox.put(c.BootCancelled(ticket))
                return False
        return request.error is None

    def wait_until(self, done: Callable[[], bool], seconds: float) -> bool:
        """Wait until `done()` (checked after each look around: every phase change), at most `seconds` of the
        daemon's clock."""
        deadline = self._clock.monotonic() + seconds
        with self._looked:
            while not done():
                if self._clock.monotonic() >= deadline or self._stop.is_set():
                    return done()
                self._looked.wait(LOOK_SECONDS)
        return True

    # -- what the gateway and the workers tell, and what they read -------------------------------
    def group_of(self, name: str) -> str | None:
        return self._roster.group_of(name)

    def touched(self, name: str) -> None:
        """A request went to `name` (from the gateway's loop: no I/O)."""
        self._roster.touched(name, self._clock.monotonic())

    def released(self, name: str) -> None:
        """A request to `name` ended."""
        self._roster.released(name, self._clock.monotonic())

    def in_flight(self, name: str) -> int:
        """Requests the gateway sent to `name` that have not ended."""
        return self._roster.in_flight(name)

    def draining(self, name: str) -> str | None:
        return c.draining(self._state, name)

    def held_for(self, name: str) -> float | None:
        return c.held_for(self._state, name, self._clock.monotonic())

    def refused(self, name: str) -> str | None:
        return c.refused(self._state, name, self._clock.monotonic())

    def upgrade_hold(self, name: str) -> str | None:
        """The deployment whose upgrade holds `name`'s GPUs (or `name`'s own), if any."""
        worker = self._fleet.snapshot().get(name)
        gpus = frozenset(worker.machine.gpu_uuids) if worker is not None else frozenset()
        return c.upgrade_hold(self._state, name, gpus)

    def idle_sleep_in(self, name: str) -> float | None:
        """Seconds until awake `name` sleeps for want of requests (its idle_sleep_seconds; `dankserve status`),
        None when it does not count down now."""
        group = self.group_of(name)
        dep = self._fleet.settings.deployments.get(name)
        if group is None or dep is None:
            return None
        now = self._clock.monotonic()
        turn = c.members_of(self._state, self._view(), group)
        member = next((m for m in turn if m.name == name), None)
        return None if member is None else swap.idle_sleep_in(member, dep.idle_sleep_seconds, now)

    def record_plan(self, name: str, facts: PlanFacts) -> None:
        self._roster.record_plan(name, facts)

    def sleep_level(self, name: str, state: m.MachineState, *, waker: str | None = None) -> swap.LevelChoice:
        """Level 1, 2, stop or suspend for `name` now (RAM and GPU memory are read here: they change); `waker`:
        the member the sleep makes room for (suspend is weighed against it)."""
        facts = self._roster.facts(name)
        sleep_mode = facts.sleep_mode if facts is not None else capabilities(state.vllm_version).has(SLEEP_MODE_FLAG)
        dep = self._fleet.settings.deployments.get(name)
        forced = dep.sleep_level if dep is not None else "auto"
        if forced == "suspend":
            return self._with_suspend(swap.forced_level("1", sleep_mode=sleep_mode), forced, None, state)
        if forced != "auto":
            return swap.forced_level(forced, sleep_mode=sleep_mode)
        ram = self._available_ram()
        weights = facts.weights_bytes if facts is not None else None
        if ram is None or weights is None:
            # Unknown sizes never pin RAM: level 2 keeps nothing in it.
            return swap.sleep_level(1, 0, sleep_mode=sleep_mode, level_2=True)
        base = swap.sleep_level(weights, ram, sleep_mode=sleep_mode, level_2=True)
        if base.level is not swap.SleepLevel.LEVEL_1 or waker is None:
            return base
        tight = _tight(self._fleet, self._roster, self._suspend, name, state=state, waker=waker)
        return self._with_suspend(base, forced, tight, state)

    def _with_suspend(
        self, base: swap.LevelChoice, setting: str, tight: str | None, state: m.MachineState
    ) -> swap.LevelChoice:
        readings = self._suspend
        if len(state.gpu_uuids) > 1:
            unavailable: str | None = "it runs on more than one GPU (TP > 1: NCCL cannot be checkpointed)"
        else:
            unavailable = "the daemon reads no GPU checkpoint edge" if readings is None else readings.unavailable()
        return swap_suspend.choose(base, setting, unavailable=unavailable, tight_reason=tight)


def _tight(
    fleet: SwapFleet, roster: Roster, readings: SuspendReadings | None, name: str, *, state: m.MachineState, waker: str
) -> str | None:
    """Why `waker` would not fit beside `name`'s level-1 leftovers and the other sleepers' now (None: it fits)."""
    workers = fleet.snapshot()
    deps = fleet.settings.deployments
    if readings is None or waker not in workers or not state.gpu_uuids:
        return None
    uuids = tuple(state.gpu_uuids)
    totals = readings.totals(uuids)
    shares = []
    for uuid in uuids:
        total = totals.get(uuid)
        if total is None:
            continue
        awake = asleep = 0
        for other, worker in workers.items():
            if other in (name, waker) or uuid not in worker.machine.gpu_uuids:
                continue
            held_state = member_state(worker.machine.stage, admitted=False)
            dep = deps.get(other)
            if held_state in swap.HOLDING:
                share = utilization(roster.facts(other), dep.gpu_memory_utilization if dep else None)
                awake += int(share * total)
            elif held_state is swap.MemberState.ASLEEP:
                asleep += (readings.held(other) or {}).get(uuid, 0)
        waker_dep = deps.get(waker)
        waker_share = utilization(roster.facts(waker), waker_dep.gpu_memory_utilization if waker_dep else None)
        shares.append(swap_suspend.GpuShare(uuid, total, int(waker_share * total), awake, asleep, CUDA_CONTEXT_BYTES))
    return swap_suspend.tight(shares)
