"""The daemon's side of swap groups (issue 16): who sleeps, who wakes, and when members may boot.

It keeps what the pure decisions in `swap` need (each member's last use and requests in
flight, wakes asked for) and turns their answers into machine events for the members'
workers: `SleepRequested(level)` and `WakeRequested`. Its thread looks around whenever a
phase changes (and at least every quarter second): pending wakes, members ready for the first
time, idle members. Workers ask `admit_boot` before a boot takes GPU memory, so a boot (a
first boot, a restart, a wake by booting) always finds room.

At start-up each member's first boot happens one at a time; every member but the group's first
(in configuration order) is put to sleep once ready, and the first boots last and stays awake.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import structlog

from dankserve.plan.catalogue import capabilities
from dankserve.plan.plan import SLEEP_MODE_FLAG
from dankserve.supervisor import machine as m
from dankserve.supervisor.fleet import swap
from dankserve.supervisor.fleet.swap import CannotFit, Swap
from dankserve.supervisor.fleet.swap_bound import SwapBound
from dankserve.supervisor.fleet.swap_checks import safe_choice
from dankserve.supervisor.fleet.swap_fit import sleeps_after_first_boot
from dankserve.supervisor.fleet.swap_roster import HOLDING_STAGES, PlanFacts, Roster, SwapFleet, SwapMember

__all__ = ["PlanFacts", "SwapFleet", "SwapGroups", "SwapMember"]

log = structlog.get_logger("dankserve.swap")

LOOK_SECONDS = 0.25
"""The coordinator looks around at least this often."""
REFUSAL_SECONDS = 10.0
"""How long a wake that cannot fit is refused at once (503) before it is tried again (pinned members may go)."""
_FIRST_TURN_OVER = frozenset(
    {
        *(m.Stage.READY, m.Stage.FALLING_ASLEEP, m.Stage.ASLEEP, m.Stage.WAKING),
        *(m.Stage.DECIDING, m.Stage.BACKOFF, m.Stage.RETRY_WAIT, m.Stage.FAILED, m.Stage.STOPPED),
    }
)  # ready (perhaps put to sleep already, to make room), or its first boot failed: the next first boot may begin
_NOT_YET = frozenset({m.Stage.IDLE, m.Stage.DOWNLOADING, m.Stage.PULLING, m.Stage.PLANNING, m.Stage.WAITING_GPUS})


class SwapGroups:
    """Coordinates the members of every swap group of one daemon."""

    def __init__(self, fleet: SwapFleet, available_ram: Callable[[], int | None]) -> None:
        self._fleet = fleet
        self._roster = Roster(fleet)
        self._available_ram = available_ram
        self._lock = threading.RLock()
        self._wanted: set[str] = set()
        self._refused: dict[str, tuple[str, float]] = {}
        """Wakes that cannot fit: the reason and when (a refusal holds for REFUSAL_SECONDS, then is looked at again)."""
        self._booted: set[str] = set()
        """Members whose first boot since the daemon started is over (ready, or failed)."""
        self._admitted: set[str] = set()
        """Members let past `admit_boot` whose boot has not yet taken its GPU memory (they count as holding)."""
        self._bound = SwapBound()
        self._draining: dict[str, str] = {}
        """Awake members finishing their requests before a swap to another (the member it is for)."""
        self._boot_drains: dict[str, tuple[str, ...]] = {}
        """The same for a boot waiting in `admit_boot` (a wake by booting): booting member -> busy members."""
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifetime ---------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="swap-groups", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._changed.set()
        if self._thread is not None:
            self._thread.join(5)

    def poke(self) -> None:
        """Something changed (a phase): look around now."""
        self._changed.set()

    # -- what the gateway and the workers tell ----------------------------------------------------
    def group_of(self, name: str) -> str | None:
        return self._roster.group_of(name)

    def touched(self, name: str) -> None:
        """A request went to `name` (from the gateway's loop: no I/O)."""
        self._roster.touched(name, time.monotonic())

    def released(self, name: str) -> None:
        """A request to `name` ended."""
        self._roster.released(name, time.monotonic())

    def in_flight(self, name: str) -> int:
        """Requests the gateway sent to `name` that have not ended."""
        return self._roster.in_flight(name)

    def wake(self, name: str) -> None:
        """Make `name` ready (from the gateway's loop or the control socket: returns at once)."""
        if self.group_of(name) is None:
            return
        with self._lock:
            self._wanted.add(name)
            self._refused.pop(name, None)
        self._changed.set()

    def draining(self, name: str) -> str | None:
        """The member a swap away from awake `name` is for, while `name` finishes its requests (new ones wait)."""
        with self._lock:
            found = self._draining.get(name)
            return found or next((boot for boot, busy in self._boot_drains.items() if name in busy), None)

    def held_for(self, name: str) -> float | None:
        """Seconds until the swap bound lets a wake of `name` begin (None: not held)."""
        with self._lock:
            at = self._bound.held_until(name)
        return None if at is None else max(0.0, at - time.monotonic())

    def idle_sleep_in(self, name: str) -> float | None:
        """Seconds until awake `name` sleeps for want of requests (its idle_sleep_seconds; `dankserve status`),
        None when it does not count down now."""
        group = self.group_of(name)
        dep = self._fleet.settings.deployments.get(name)
        if group is None or dep is None:
            return None
        with self._lock:
            admitted = set(self._admitted)
        member = next((m for m in self._roster.members(group, admitted) if m.name == name), None)
        return None if member is None else swap.idle_sleep_in(member, dep.idle_sleep_seconds, time.monotonic())

    def refused(self, name: str) -> str | None:
        """Why the last wake of `name` cannot happen (the gateway answers 503 with it), or None."""
        with self._lock:
            found = self._refused.get(name)
            if found is None or time.monotonic() - found[1] > REFUSAL_SECONDS:
                self._refused.pop(name, None)
                return None
            return found[0]

    def record_plan(self, name: str, facts: PlanFacts) -> None:
        self._roster.record_plan(name, facts)

    def sleep(self, name: str, reason: str) -> str | None:
        """Put a ready member to sleep now (`dankserve sleep`); the error text when it cannot."""
        worker = self._fleet.snapshot().get(name)
        if self.group_of(name) is None:
            return f"deployment {name!r} is in no swap group: set swap_group to let it sleep"
        if worker is None:
            return f"deployment {name!r} is not running"
        stage = worker.machine.stage
        if stage in (m.Stage.ASLEEP, m.Stage.FALLING_ASLEEP):
            return None
        if stage is not m.Stage.READY:
            return f"deployment {name!r} is {worker.machine.status}: only a ready deployment can be put to sleep"
        with self._lock:
            self._unwant(name)
        self._put_to_sleep(worker, reason)
        return None

    # -- boots ------------------------------------------------------------------------------------
    def admit_boot(
        self,
        name: str,
        uuids: tuple[str, ...],
        cancelled: threading.Event,
        waits: Callable[[str], None] = lambda why: None,
    ) -> bool:
        """Block until `name` may boot on `uuids`: its group's awake members fit beside it (others
        are put to sleep meanwhile) and, at start-up, the group's first boots come in order. False
        when cancelled. `waits(why)` is told why while it waits (status shows it)."""
        group = self.group_of(name)
        if group is None:
            return True
        announced = False
        try:
            while not cancelled.is_set() and not self._stop.is_set():
                with self._lock:
                    why = self._boot_waits_for(name, group)
                    if why is None:
                        members = self._roster.members(group, self._admitted, target=name, target_gpus=uuids)
                        decision = swap.make_room(members, name, time.monotonic())
                        self._boot_drains[name] = swap.draining(decision, members)
                        if isinstance(decision, Swap):
                            if not decision.sleep:
                                self._admitted.add(name)
                                return True
                            for sleeper in decision.sleep:
                                self._sleep_member(sleeper, f"make room for {name}'s boot")
                            why = "members falling asleep: " + ", ".join(decision.sleep)
                        else:
                            why = decision.reason
                waits(f"swap group {group}: {why}")
                if not announced:
                    log.info("swap_boot_waits", deployment=name, reason=why)
                    announced = True
                self._changed.wait(LOOK_SECONDS)
            return False
        finally:
            with self._lock:
                self._boot_drains.pop(name, None)

    def _boot_waits_for(self, name: str, group: str) -> str | None:
        """At start-up: one first boot at a time, and the group's first member after the others."""
        if name in self._booted:
            return None
        members = self._roster.names(group)
        pending = [n for n in members if n not in self._booted and n != name]
        workers = self._fleet.snapshot()
        booting = [
            n for n in pending if n in self._admitted or (n in workers and workers[n].machine.stage in HOLDING_STAGES)
        ]
        if booting:
            return f"first boots come one at a time: {booting[0]} boots"
        if members and name == members[0] and pending:
            return f"the group's first member boots last (after {', '.join(pending)}) and stays awake"
        return None

    # -- the look around --------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._changed.wait(LOOK_SECONDS)
            self._changed.clear()
            try:
                self._look()
            except Exception:  # a bug here must not end swapping for good
                log.exception("swap_error")

    def _look(self) -> None:
        now = time.monotonic()
        workers = self._fleet.snapshot()
        groups: dict[str, list[str]] = {}
        with self._lock:
            for name, worker in workers.items():
                group = self.group_of(name)
                if group is None:
                    continue
                groups.setdefault(group, []).append(name)
                stage = worker.machine.stage
                if stage not in _NOT_YET:
                    self._admitted.discard(name)
                if stage in _FIRST_TURN_OVER and name not in self._booted:
                    self._first_ready(name, worker, group)
                if stage is m.Stage.READY:
                    self._roster.used(name, now, unless_known=True)
            for group in groups:
                self._serve_wakes(group, now)
                self._idle_sleep(group, now)

    def _first_ready(self, name: str, worker: SwapMember, group: str) -> None:
        self._booted.add(name)
        members = self._roster.names(group)
        asked = name in self._wanted
        state = worker.machine
        # A server adopted from an earlier daemon (killed with -9) was the awake one: it stays awake.
        adopted = state.boot is not None and state.boot.adopted
        first = swap.sleeps_after_first_boot(name, members) and sleeps_after_first_boot(self._fleet.settings, name)
        if state.stage is m.Stage.READY and first and not asked and not adopted:
            self._put_to_sleep(worker, f"first boot done; {members[0]} is the group's awake member")

    def _serve_wakes(self, group: str, now: float) -> None:
        workers = self._fleet.snapshot()
        names = self._roster.names(group)
        for gone in [n for n in self._draining if n in names]:
            del self._draining[gone]  # found again below while its swap still waits for it
        for name in [n for n in names if n in self._wanted]:
            worker = workers.get(name)
            if worker is None:
                self._unwant(name)
                continue
            state = worker.machine
            if state.stage in (m.Stage.FALLING_ASLEEP, m.Stage.DECIDING):
                continue  # woken once asleep (deciding: a server that died asleep stays asleep, by stop)
            if state.stage is not m.Stage.ASLEEP:
                self._unwant(name)  # ready already, or booting / restarting on its own
                continue
            members = self._roster.members(group, self._admitted)
            decision = swap.make_room(members, name, now)
            if self._held_by_bound(group, name, decision, now):
                continue
            for busy in swap.draining(decision, members):
                self._draining[busy] = name
            if state.swap.level == "stop":  # a boot: admit_boot makes the room
                self._wake_member(name, worker, now)
                continue
            if isinstance(decision, Swap):
                if not decision.sleep:
                    self._wake_member(name, worker, now)
                for sleeper in decision.sleep:
                    self._sleep_member(sleeper, f"make room for {name}")
            elif isinstance(decision, CannotFit):
                self._unwant(name)
                self._refused[name] = (decision.reason, now)
                log.error("swap_cannot_fit", deployment=name, reason=decision.reason)

    def _held_by_bound(self, group: str, name: str, decision: swap.Swap | swap.Wait | CannotFit, now: float) -> bool:
        """Whether the group's swap bound holds this wake back (`SwapBound.holds`)."""
        gateway = self._fleet.settings.gateway
        bound = gateway.max_swaps_per_minute if gateway is not None else None
        return self._bound.holds(group, name, decision, now, bound)

    def _unwant(self, name: str) -> None:
        self._wanted.discard(name)
        self._bound.forget(name)

    def _idle_sleep(self, group: str, now: float) -> None:
        deps = self._fleet.settings.deployments
        limits = {n: deps[n].idle_sleep_seconds for n in self._roster.names(group) if n in deps}
        for name in swap.idle_sleepers(self._roster.members(group, self._admitted), limits, now):
            if name not in self._wanted:
                self._sleep_member(name, f"idle for {limits[name]:g} s")

    # -- acting -----------------------------------------------------------------------------------
    def _wake_member(self, name: str, worker: SwapMember, now: float) -> None:
        self._unwant(name)
        self._roster.used(name, now)
        log.info("swap_wake", deployment=name, level=worker.machine.swap.level)
        worker.feed(m.WakeRequested())

    def _sleep_member(self, name: str, reason: str) -> None:
        worker = self._fleet.snapshot().get(name)
        if worker is not None and worker.machine.stage is m.Stage.READY:
            self._put_to_sleep(worker, reason)

    def _put_to_sleep(self, worker: SwapMember, reason: str) -> None:
        choice = safe_choice(self._fleet, worker.name, worker.machine, self.sleep_level(worker.name, worker.machine))
        log.info("swap_sleep", deployment=worker.name, level=choice.level.value, reason=reason, why=choice.reason)
        worker.feed(m.SleepRequested(choice.level.value, reason))

    def sleep_level(self, name: str, state: m.MachineState) -> swap.LevelChoice:
        """Level 1, 2 or stop for `name` now (RAM is read here: it changes)."""
        facts = self._roster.facts(name)
        sleep_mode = facts.sleep_mode if facts is not None else capabilities(state.vllm_version).has(SLEEP_MODE_FLAG)
        dep = self._fleet.settings.deployments.get(name)
        forced = dep.sleep_level if dep is not None else "auto"
        if forced != "auto":
            return swap.forced_level(forced, sleep_mode=sleep_mode)
        ram = self._available_ram()
        weights = facts.weights_bytes if facts is not None else None
        if ram is None or weights is None:
            # Unknown sizes never pin RAM: level 2 keeps nothing in it.
            return swap.sleep_level(1, 0, sleep_mode=sleep_mode, level_2=True)
        return swap.sleep_level(weights, ram, sleep_mode=sleep_mode, level_2=True)
