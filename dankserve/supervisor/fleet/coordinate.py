"""The fleet's one decider of sleep and wake (issue 40 item 2), pure: `coordinate(state, fleet, intent, now)
-> (state, directives)`, in the manner of the lifecycle's `step()`.

Everything that decides who sleeps, who wakes and who may boot lives here, over frozen data: the
`FleetState` the coordinator keeps between intents (wakes asked for, refusals, first boots, admitted
boots, drains, the swap bound's memory, upgrade holds), the `FleetView` of the members now (their
stage, GPUs, use, settings), and one `Intent` (a look around, a wake, a sleep, a boot asking for
room, an upgrade's hold). The answer is the next state and the `Directive`s the coordinator thread
(`fleet/coordinator.py`) executes: feed a worker `SleepRequested`/`WakeRequested`, admit a boot or tell
it why it waits, answer a request, log. Nothing here reads a clock, a socket or a worker.

At start-up each member's first boot happens one at a time; every member but the group's first (in
configuration order) is put to sleep once ready, and the first boots last and stays awake. An upgrade
holds its deployment's GPUs while its trial server runs (`UpgradeHold`): no other member of its swap
group is woken or booted onto them, and a wake of the deployment itself by anyone but the upgrade is
held (the upgrade decides which server serves when it ends).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from dankserve.supervisor import machine as m
from dankserve.supervisor.fleet import swap
from dankserve.supervisor.fleet.swap import CannotFit, Member, Swap, Wait
from dankserve.supervisor.fleet.swap_roster import HOLDING_STAGES, member_state

WAKE_FED_SECONDS = 30.0
"""How long a member fed a wake whose worker still shows asleep counts as waking (a worker moves at once;
this only keeps a wake lost before any look saw it from holding its GPUs for good)."""
REFUSAL_SECONDS = 10.0
"""How long a wake that cannot fit is refused at once (503) before it is tried again (pinned members may go)."""
FIRST_TURN_OVER = frozenset(
    {
        *(m.Stage.READY, m.Stage.FALLING_ASLEEP, m.Stage.ASLEEP, m.Stage.WAKING),
        *(m.Stage.DECIDING, m.Stage.BACKOFF, m.Stage.RETRY_WAIT, m.Stage.FAILED, m.Stage.STOPPED),
    }
)  # ready (perhaps put to sleep already, to make room), or its first boot failed: the next first boot may begin
NOT_YET = frozenset({m.Stage.IDLE, m.Stage.DOWNLOADING, m.Stage.PULLING, m.Stage.PLANNING, m.Stage.WAITING_GPUS})
"""A boot admitted in these stages has not taken its GPU memory yet: it counts as holding by its admission."""

By = Literal["gateway", "cli", "upgrade"]


# -- what the coordinator sees ----------------------------------------------------------------------------
@dataclass(frozen=True)
class MemberView:
    """One deployment's worker now, as the decisions read it."""

    name: str
    group: str | None
    stage: m.Stage
    status: str
    """Its `status` word (for messages)."""
    gpus: frozenset[str]
    utilization: float
    last_used: float
    """Its last request's start or end (the gateway's), 0 when none."""
    in_flight: int = 0
    pinned: bool = False
    wake_cost_seconds: float | None = None
    resident_until: float = 0.0
    asleep_by_stop: bool = False
    """Asleep (or falling asleep) by stop: a wake boots it, and its boot admission makes the room."""
    adopted: bool = False
    """Its server was adopted from an earlier daemon (that one's awake member stays awake)."""
    sleeps_after_first_boot: bool = True
    """Its settings let it be put to sleep once its first boot is done (`swap_fit.sleeps_after_first_boot`)."""
    idle_sleep_seconds: float | None = None


@dataclass(frozen=True)
class FleetView:
    """The fleet now: each swap group's members in configuration order, each worker's view, the swap bound."""

    groups: Mapping[str, tuple[str, ...]]
    members: Mapping[str, MemberView]
    swaps_per_minute: int | None = None


# -- what the coordinator keeps ------------------------------------------------------------------------------
@dataclass(frozen=True)
class BootAsk:
    """A boot waiting for room (a worker blocked in `admit_boot`)."""

    name: str
    gpus: tuple[str, ...]
    told: str | None = None
    """The last reason it was told it waits (told again only when it changes)."""


@dataclass(frozen=True)
class FleetState:
    """What the coordinator keeps between intents. Never changed in place: `coordinate` returns the next one."""

    wanted: frozenset[str] = frozenset()
    """Members a wake was asked for, not served yet."""
    refused: Mapping[str, tuple[str, float]] = field(default_factory=dict)
    """Wakes that cannot fit: the reason and when (held for REFUSAL_SECONDS, then looked at again)."""
    booted: frozenset[str] = frozenset()
    """Members whose first boot since the daemon started is over (ready, or failed)."""
    admitted: frozenset[str] = frozenset()
    """Members let past boot admission whose boot has not taken its GPU memory yet (they count as holding)."""
    boots: Mapping[int, BootAsk] = field(default_factory=dict)
    """Boots waiting for room, by ticket (asked order)."""
    draining: Mapping[str, str] = field(default_factory=dict)
    """Awake members finishing their requests before a swap to another (the member it is for)."""
    boot_drains: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """The same for a boot waiting for room: booting member -> busy members."""
    used: Mapping[str, float] = field(default_factory=dict)
    """Uses the coordinator counts itself: woken, or first seen ready (the gateway's are in the view)."""
    swaps: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    """The swap bound's memory: each group's swap starts within the last minute."""
    swapping_to: frozenset[str] = frozenset()
    """Wanted members whose swap has begun (counted once by the bound)."""
    held: Mapping[str, float] = field(default_factory=dict)
    """Wanted members the bound holds back: when (monotonic) their swap may begin."""
    upgrades: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Upgrade holds: deployment -> the GPUs its trial server holds."""
    woken: Mapping[str, float] = field(default_factory=dict)
    """Members fed a wake (when) whose worker has not left asleep yet: they count as waking, so that a wake of
    another member decided meanwhile (the same look, or the next intent) sees them holding their GPUs."""


# -- intents -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Look:
    """A look around: a phase changed, or the coordinator's tick."""


@dataclass(frozen=True)
class Wake:
    """Make `name` ready (the gateway's request, `dankserve wake`, or an upgrade giving the old server back)."""

    name: str
    by: By


@dataclass(frozen=True)
class Sleep:
    """Put ready `name` to sleep now (`dankserve sleep`, an upgrade making room); `level` forces one."""

    name: str
    reason: str
    by: By
    ticket: int | None = None
    level: str | None = None


@dataclass(frozen=True)
class BootAsked:
    """A worker's boot asks for room on `gpus` before it takes GPU memory."""

    ticket: int
    name: str
    gpus: tuple[str, ...]


@dataclass(frozen=True)
class BootCancelled:
    """The boot that asked stopped waiting (its worker was stopped)."""

    ticket: int


@dataclass(frozen=True)
class UpgradeHold:
    """An upgrade's trial server of `name` holds `gpus` until `UpgradeRelease`."""

    name: str
    gpus: frozenset[str]


@dataclass(frozen=True)
class UpgradeRelease:
    name: str


Intent = Look | Wake | Sleep | BootAsked | BootCancelled | UpgradeHold | UpgradeRelease


# -- directives ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FeedSleep:
    """Feed `name`'s worker `SleepRequested` (the level: `level`, else the one RAM and the checks allow)."""

    name: str
    reason: str
    level: str | None = None
    waker: str | None = None
    """The member the sleep makes room for (its wake or boot): suspend is weighed against its share."""


@dataclass(frozen=True)
class FeedWake:
    name: str


@dataclass(frozen=True)
class AdmitBoot:
    ticket: int


@dataclass(frozen=True)
class BootWaits:
    """Tell the waiting boot why (status shows it)."""

    ticket: int
    why: str


@dataclass(frozen=True)
class Answer:
    """Answer a request: None when done, else why not."""

    ticket: int
    error: str | None


@dataclass(frozen=True)
class Note:
    """A log line (the event and its fields)."""

    event: str
    fields: tuple[tuple[str, object], ...] = ()
    error: bool = False


Directive = FeedSleep | FeedWake | AdmitBoot | BootWaits | Answer | Note


# -- the decider ---------------------------------------------------------------------------------------------
class _Turn:
    """One call's working copy: the state's fields as they change, and the directives so far."""

    def __init__(self, state: FleetState, fleet: FleetView, now: float) -> None:
        self.fleet, self.now = fleet, now
        self.wanted = set(state.wanted)
        self.refused = dict(state.refused)
        self.booted = set(state.booted)
        self.admitted = set(state.admitted)
        self.boots = dict(state.boots)
        self.draining = dict(state.draining)
        self.boot_drains = dict(state.boot_drains)
        self.used = dict(state.used)
        self.swaps = dict(state.swaps)
        self.swapping_to = set(state.swapping_to)
        self.held = dict(state.held)
        self.upgrades = dict(state.upgrades)
        self.woken = dict(state.woken)
        self.out: list[Directive] = []

    def state(self) -> FleetState:
        return FleetState(
            frozenset(self.wanted),
            self.refused,
            frozenset(self.booted),
            frozenset(self.admitted),
            self.boots,
            self.draining,
            self.boot_drains,
            self.used,
            self.swaps,
            frozenset(self.swapping_to),
            self.held,
            self.upgrades,
            self.woken,
        )

    # -- members as the pure swap decisions take them --------------------------------------------------------
    def members(self, group: str, target: str | None = None, target_gpus: tuple[str, ...] = ()) -> list[Member]:
        out = []
        for name in self.fleet.groups.get(group, ()):
            view = self.fleet.members.get(name)
            if view is None:
                continue
            gpus = frozenset(target_gpus) if name == target else view.gpus
            state = swap.MemberState.ASLEEP if name == target else member_state(view.stage, name in self.admitted)
            if name != target and name in self.woken and state is swap.MemberState.ASLEEP:
                state = swap.MemberState.WAKING  # fed a wake its worker has not taken up yet
            last = max(view.last_used, self.used.get(name, 0.0))
            facts = (view.in_flight, view.pinned, view.wake_cost_seconds, view.resident_until)
            out.append(Member(name, gpus, view.utilization, state, last, *facts))
        return out

    def upgrade_on(self, name: str, gpus: frozenset[str]) -> str | None:
        return _holder(self.upgrades, name, gpus)

    # -- acting --------------------------------------------------------------------------------------------------
    def note(self, event: str, *, error: bool = False, **fields: object) -> None:
        self.out.append(Note(event, tuple(fields.items()), error))

    def unwant(self, name: str) -> None:
        self.wanted.discard(name)
        self.swapping_to.discard(name)
        self.held.pop(name, None)

    def wake_member(self, name: str) -> None:
        self.unwant(name)
        self.used[name] = self.now
        self.woken[name] = self.now
        view = self.fleet.members[name]
        self.note("swap_wake", deployment=name, level="stop" if view.asleep_by_stop else "sleep mode")
        self.out.append(FeedWake(name))

    def sleep_member(self, name: str, reason: str, waker: str | None = None) -> None:
        view = self.fleet.members.get(name)
        asked = any(isinstance(d, FeedSleep) and d.name == name for d in self.out)
        if view is not None and view.stage is m.Stage.READY and not asked:
            self.out.append(FeedSleep(name, reason, waker=waker))

    def bound_holds(self, group: str, name: str, decision: Swap | Wait | CannotFit) -> bool:
        """Whether the group's swap bound holds this wake back; a swap that begins (others must sleep) is counted."""
        swaps = (isinstance(decision, Swap) and decision.sleep) or isinstance(decision, Wait)
        if not swaps or name in self.swapping_to:
            return False
        begun = swap.recent_swaps(self.swaps.get(group, ()), self.now)
        per_minute = self.fleet.swaps_per_minute
        at = swap.next_swap_at(begun, self.now, per_minute)
        if at is not None:
            if name not in self.held:
                seconds = round(at - self.now, 1)
                self.note("swap_held", deployment=name, swap_group=group, per_minute=per_minute, seconds=seconds)
            self.held[name] = at
            return True
        self.held.pop(name, None)
        self.swaps[group] = (*begun, self.now)
        self.swapping_to.add(name)
        return False

    # -- the look around ---------------------------------------------------------------------------------------
    def look(self) -> None:
        now = self.now
        self.refused = {n: r for n, r in self.refused.items() if now - r[1] <= REFUSAL_SECONDS}
        members = self.fleet.members
        self.woken = {  # once its worker moved (waking, ready, failed) its stage tells
            n: at
            for n, at in self.woken.items()
            if n in members and members[n].stage is m.Stage.ASLEEP and now - at <= WAKE_FED_SECONDS
        }
        groups: list[str] = []
        for name, view in self.fleet.members.items():
            if view.group is None:
                continue
            if view.group not in groups:
                groups.append(view.group)
            if view.stage not in NOT_YET:
                self.admitted.discard(name)
            if view.stage in FIRST_TURN_OVER and name not in self.booted:
                self.first_ready(view)
            if view.stage is m.Stage.READY and name not in self.used and view.last_used == 0.0:
                self.used[name] = now
        for group in groups:
            self.serve_wakes(group)
            self.serve_boots(group)
            self.idle_sleep(group)
        self.serve_ungrouped()

    def first_ready(self, view: MemberView) -> None:
        self.booted.add(view.name)
        names = self.fleet.groups.get(view.group or "", ())
        first = swap.sleeps_after_first_boot(view.name, names) and view.sleeps_after_first_boot
        asked = view.name in self.wanted
        if view.stage is m.Stage.READY and first and not asked and not view.adopted:
            self.sleep_member(view.name, f"first boot done; {names[0]} is the group's awake member")

    def serve_wakes(self, group: str) -> None:
        names = self.fleet.groups.get(group, ())
        self.draining = {n: w for n, w in self.draining.items() if n not in names}  # found again below
        # a wake whose swap began (others were put to sleep for it) goes first: one asked meanwhile waits its turn
        for name in sorted((n for n in names if n in self.wanted), key=lambda n: n not in self.swapping_to):
            view = self.fleet.members.get(name)
            if view is None:
                self.unwant(name)
                continue
            if view.stage in (m.Stage.FALLING_ASLEEP, m.Stage.DECIDING):
                continue  # woken once asleep (deciding: a server that died asleep stays asleep, by stop)
            if view.stage is not m.Stage.ASLEEP or name in self.woken:
                self.unwant(name)  # ready already, being woken, or booting / restarting on its own
                continue
            if self.upgrade_on(name, view.gpus) is not None:
                continue  # an upgrade's trial holds its GPUs: woken once the upgrade ends
            members = self.members(group)
            decision = swap.make_room(members, name, self.now)
            if self.bound_holds(group, name, decision):
                continue
            for busy in swap.draining(decision, members):
                self.draining[busy] = name
            if view.asleep_by_stop:  # a boot: its boot admission makes the room
                self.wake_member(name)
            elif isinstance(decision, Swap):
                if not decision.sleep:
                    self.wake_member(name)
                for sleeper in decision.sleep:
                    self.sleep_member(sleeper, f"make room for {name}", name)
            elif isinstance(decision, CannotFit):
                self.unwant(name)
                self.refused[name] = (decision.reason, self.now)
                self.note("swap_cannot_fit", error=True, deployment=name, reason=decision.reason)

    def serve_ungrouped(self) -> None:
        """Wakes of deployments in no swap group (an upgrade giving back an old server it stopped or slept)."""
        for name in sorted(self.wanted):
            view = self.fleet.members.get(name)
            if view is not None and view.group is not None:
                continue
            if view is None or view.stage not in (m.Stage.ASLEEP, m.Stage.FALLING_ASLEEP, m.Stage.DECIDING):
                self.unwant(name)
            elif view.stage is m.Stage.ASLEEP:
                self.wake_member(name)

    def boot_waits_for(self, name: str, group: str, gpus: frozenset[str]) -> str | None:
        """What a boot waits for before room is made: an upgrade's hold, or start-up's order of first boots."""
        holder = self.upgrade_on(name, gpus)
        if holder is not None and holder != name:
            return f"{holder}'s upgrade tries its new server on these GPUs"
        if name in self.booted:
            return None
        names = self.fleet.groups.get(group, ())
        pending = [n for n in names if n not in self.booted and n != name]
        holding = [
            n
            for n in pending
            if n in self.admitted or (n in self.fleet.members and self.fleet.members[n].stage in HOLDING_STAGES)
        ]
        if holding:
            return f"first boots come one at a time: {holding[0]} boots"
        if names and name == names[0] and pending:
            return f"the group's first member boots last (after {', '.join(pending)}) and stays awake"
        return None

    def serve_boots(self, group: str) -> None:
        for ticket, ask in sorted(self.boots.items()):
            view = self.fleet.members.get(ask.name)
            if view is None or view.group != group:
                continue
            why = self.boot_waits_for(ask.name, group, frozenset(ask.gpus))
            if why is None:
                members = self.members(group, target=ask.name, target_gpus=ask.gpus)
                decision = swap.make_room(members, ask.name, self.now)
                self.boot_drains[ask.name] = swap.draining(decision, members)
                if isinstance(decision, Swap) and not decision.sleep:
                    self.admit(ticket, ask.name)
                    continue
                if isinstance(decision, Swap):
                    for sleeper in decision.sleep:
                        self.sleep_member(sleeper, f"make room for {ask.name}'s boot", ask.name)
                    why = "members falling asleep: " + ", ".join(decision.sleep)
                else:
                    why = decision.reason
            told = f"swap group {group}: {why}"
            if told != ask.told:
                if ask.told is None:
                    self.note("swap_boot_waits", deployment=ask.name, reason=why)
                self.out.append(BootWaits(ticket, told))
                self.boots[ticket] = replace(ask, told=told)

    def admit(self, ticket: int, name: str) -> None:
        self.boots.pop(ticket, None)
        self.boot_drains.pop(name, None)
        self.admitted.add(name)
        self.out.append(AdmitBoot(ticket))

    def idle_sleep(self, group: str) -> None:
        names = self.fleet.groups.get(group, ())
        limits = {n: self.fleet.members[n].idle_sleep_seconds for n in names if n in self.fleet.members}
        for name in swap.idle_sleepers(self.members(group), limits, self.now):
            if name not in self.wanted:
                self.sleep_member(name, f"idle for {limits[name]:g} s")

    # -- the intents -----------------------------------------------------------------------------------------
    def wake(self, intent: Wake) -> None:
        view = self.fleet.members.get(intent.name)
        if view is None or (view.group is None and intent.by != "upgrade"):
            return  # outside a swap group a deployment gets ready by itself (booting, restarting)
        if intent.by != "upgrade" and intent.name in self.upgrades:
            self.note("wake_held", deployment=intent.name, by=intent.by, reason="an upgrade is under way")
            return  # the upgrade decides which server serves when it ends
        self.wanted.add(intent.name)
        self.refused.pop(intent.name, None)

    def sleep(self, intent: Sleep) -> None:
        name = intent.name
        view = self.fleet.members.get(name)
        error: str | None = None
        if view is not None and view.group is None and intent.by != "upgrade":
            error = f"deployment {name!r} is in no swap group: set swap_group to let it sleep"
        elif view is None:
            error = f"deployment {name!r} is not running"
        elif view.stage in (m.Stage.ASLEEP, m.Stage.FALLING_ASLEEP):
            pass
        elif view.stage is not m.Stage.READY:
            error = f"deployment {name!r} is {view.status}: only a ready deployment can be put to sleep"
        else:
            self.unwant(name)
            self.out.append(FeedSleep(name, intent.reason, intent.level))
        if intent.ticket is not None:
            self.out.append(Answer(intent.ticket, error))

    def boot_asked(self, intent: BootAsked) -> None:
        view = self.fleet.members.get(intent.name)
        if view is None or view.group is None:
            self.admit(intent.ticket, intent.name)
            self.admitted.discard(intent.name)  # outside a swap group nothing counts it
            return
        self.boots[intent.ticket] = BootAsk(intent.name, intent.gpus)

    def boot_cancelled(self, intent: BootCancelled) -> None:
        ask = self.boots.pop(intent.ticket, None)
        if ask is not None:
            self.boot_drains.pop(ask.name, None)


def coordinate(state: FleetState, fleet: FleetView, intent: Intent, now: float) -> tuple[FleetState, list[Directive]]:
    """The next state and what to do, for one intent (every intent ends with a look around)."""
    turn = _Turn(state, fleet, now)
    if isinstance(intent, Wake):
        turn.wake(intent)
    elif isinstance(intent, Sleep):
        turn.sleep(intent)
    elif isinstance(intent, BootAsked):
        turn.boot_asked(intent)
    elif isinstance(intent, BootCancelled):
        turn.boot_cancelled(intent)
    elif isinstance(intent, UpgradeHold):
        turn.upgrades[intent.name] = intent.gpus
        turn.unwant(intent.name)
        turn.note("upgrade_hold", deployment=intent.name, gpus=sorted(intent.gpus))
    elif isinstance(intent, UpgradeRelease) and turn.upgrades.pop(intent.name, None) is not None:
        turn.note("upgrade_release", deployment=intent.name)
    turn.look()
    return turn.state(), turn.out


# -- what the latest state answers -----------------------------------------------------------------------------
def draining(state: FleetState, name: str) -> str | None:
    """The member a swap away from awake `name` is for, while `name` finishes its requests (new ones wait)."""
    found = state.draining.get(name)
    return found or next((boot for boot, busy in state.boot_drains.items() if name in busy), None)


def held_for(state: FleetState, name: str, now: float) -> float | None:
    """Seconds until the swap bound lets a wake of `name` begin (None: not held)."""
    at = state.held.get(name)
    return None if at is None else max(0.0, at - now)


def refused(state: FleetState, name: str, now: float) -> str | None:
    """Why the last wake of `name` cannot happen (the gateway answers 503 with it), or None."""
    found = state.refused.get(name)
    return None if found is None or now - found[1] > REFUSAL_SECONDS else found[0]


def upgrade_hold(state: FleetState, name: str, gpus: frozenset[str]) -> str | None:
    """The deployment whose upgrade holds `name` (its own, or one on its GPUs), if any."""
    return _holder(state.upgrades, name, gpus)


def members_of(state: FleetState, fleet: FleetView, group: str) -> list[Member]:
    """The group's members as the swap decisions see them now (`status`'s idle countdown)."""
    return _Turn(state, fleet, 0.0).members(group)


def _holder(upgrades: Mapping[str, frozenset[str]], name: str, gpus: frozenset[str]) -> str | None:
    for holder, held in sorted(upgrades.items()):
        if holder == name or held & gpus:
            return holder
    return None
