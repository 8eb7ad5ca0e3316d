"""Swap groups' decisions (issue 16), pure: which members sleep so another can wake, which have
been idle too long, how deep a member sleeps, which busy members drain for a wake, and when the
group's bound on swaps per minute lets the next swap begin (issue 29).

Deployments of one swap group share GPUs with utilisations that sum above the 0.95 budget; at
any time the awake ones fit. Nothing here talks to vLLM or reads a clock: the supervisor hands
in each member's state, last use and in-flight requests, and carries out the answer (sleep via
vLLM's `/sleep?level=N`, wake via `/wake_up`, or stop and boot).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from dankserve.supervisor.fleet.swap_fit import eviction_order, resident

if TYPE_CHECKING:
    from dankserve.settings import DeploymentSettings

GPU_BUDGET = 0.95
"""The most of each GPU the members awake on it may hold together (as for deployments sharing a GPU)."""


class MemberState(StrEnum):
    AWAKE = "awake"
    """Ready, holding its GPU memory."""
    WAKING = "waking"
    """Being woken (or booting): counts as holding its GPU memory."""
    SLEEPING = "sleeping"
    """Being put to sleep: still holds its GPU memory until asleep."""
    ASLEEP = "asleep"
    """Weights in CPU RAM (level 1) or dropped (level 2), KV cache freed: holds (almost) no GPU memory."""
    STOPPED = "stopped"
    """Not running (down, failed, or stopped instead of sleeping)."""


HOLDING = frozenset({MemberState.AWAKE, MemberState.WAKING, MemberState.SLEEPING})


@dataclass(frozen=True)
class Member:
    """One deployment of a swap group, as the supervisor sees it now."""

    name: str
    gpus: frozenset[str]
    """UUIDs of the GPUs it runs on."""
    utilization: float
    """Its gpu_memory_utilization: the fraction of each of its GPUs it holds while awake."""
    state: MemberState
    last_used: float
    """When its last request ended or began (monotonic seconds); its boot for one never used."""
    in_flight: int = 0
    """Requests it is answering now: a member with any is never put to sleep (they would fail)."""
    pinned: bool = False
    """Never put to sleep to make room for another (idle sleep neither)."""
    wake_cost_seconds: float | None = None
    """What bringing it back would cost (its predicted wake, or boot when it sleeps by stop; None: no history)."""
    resident_until: float = 0.0
    """Its `min_awake_seconds` end (monotonic): not put to sleep to make room before then (swap_fit)."""


@dataclass(frozen=True)
class Swap:
    """Put these to sleep (least recently used first), then wake the member."""

    sleep: tuple[str, ...]


@dataclass(frozen=True)
class Wait:
    """Room will come when busy members finish (or sleeping ones are asleep): ask again then."""

    reason: str
    waits_for: tuple[str, ...] = ()
    """The members it waits for (busy with requests, waking, or falling asleep)."""


@dataclass(frozen=True)
class CannotFit:
    """No choice of sleepers makes room: pinned members (or the member's own size) stand in the way."""

    reason: str


def _load(members: Sequence[Member], gpu: str, excluding: frozenset[str]) -> float:
    return sum(m.utilization for m in members if gpu in m.gpus and m.state in HOLDING and m.name not in excluding)


def _overfull(members: Sequence[Member], target: Member, sleepers: frozenset[str]) -> list[str]:
    """The target's GPUs that would exceed the budget with it awake and `sleepers` asleep."""
    out = []
    for gpu in sorted(target.gpus):
        load = _load(members, gpu, sleepers | {target.name}) + target.utilization
        if load > GPU_BUDGET + 1e-9:
            out.append(gpu)
    return out


def _greedy(members: Sequence[Member], target: Member, candidates: Sequence[Member]) -> list[str] | None:
    """Candidates (in order) to free until the target fits, skipping those on no over-full GPU; None if never."""
    chosen: list[str] = []
    for member in candidates:
        full = _overfull(members, target, frozenset(chosen))
        if not full:
            return chosen
        if member.gpus & set(full):
            chosen.append(member.name)
    return None if _overfull(members, target, frozenset(chosen)) else chosen


def make_room(members: Sequence[Member], waking: str, now: float | None = None) -> Swap | Wait | CannotFit:
    """What must sleep so that `waking` fits on its GPUs beside the members that stay awake.

    Sleepers are awake members sharing an over-full GPU with it, never pinned ones; without `now`
    least recently used first, with it the cheapest to bring back per idle second first, and none
    inside its minimum residency (swap_fit). When only members busy with requests (or still waking,
    or already falling asleep, or resident) could make room, the answer is to wait; when not even
    they could (pinned members, or its own size), it cannot fit. A member already awake or waking
    needs no room.
    """
    target = next(m for m in members if m.name == waking)
    if target.state in (MemberState.AWAKE, MemberState.WAKING):
        return Swap(())
    if target.utilization > GPU_BUDGET + 1e-9:
        return CannotFit(f"{waking} alone uses {target.utilization:g} of its GPUs, more than {GPU_BUDGET}")
    sharing = eviction_order(
        [m for m in members if m.name != waking and m.state in HOLDING and m.gpus & target.gpus and not m.pinned],
        now,
    )
    idle = [m for m in sharing if m.state is MemberState.AWAKE and m.in_flight == 0 and not resident(m, now)]
    at_once = _greedy(members, target, idle)
    if at_once is not None:
        return Swap(tuple(at_once))
    later = _greedy(members, target, sharing)
    if later is not None:
        waiting = [name for name in later if name not in {m.name for m in idle}]
        return Wait(
            f"{waking} waits for {', '.join(waiting)} (busy with requests, waking, falling asleep, or awake for "
            "less than min_awake_seconds)",
            tuple(waiting),
        )
    full = _overfull(members, target, frozenset(m.name for m in sharing))
    pinned = sorted(m.name for m in members if m.pinned and m.state in HOLDING and m.gpus & set(full))
    return CannotFit(
        f"{waking} ({target.utilization:g}) does not fit on {', '.join(full)} beside "
        + (f"pinned {', '.join(pinned)}" if pinned else "the members that stay awake")
    )


SWAP_WINDOW_SECONDS = 60.0
"""`max_swaps_per_minute` counts the swaps begun within this many seconds."""


def recent_swaps(begun: Sequence[float], now: float) -> tuple[float, ...]:
    """The swap starts still inside the window (oldest first)."""
    return tuple(sorted(at for at in begun if now - at < SWAP_WINDOW_SECONDS))


def next_swap_at(begun: Sequence[float], now: float, per_minute: int | None) -> float | None:
    """When the group's next swap may begin under its bound: None for now (or no bound), else the moment
    the oldest swap of a full window leaves it. A swap here is a wake that puts others to sleep."""
    if per_minute is None:
        return None
    window = recent_swaps(begun, now)
    if len(window) < per_minute:
        return None
    return window[-per_minute] + SWAP_WINDOW_SECONDS


def draining(decision: Swap | Wait | CannotFit, members: Sequence[Member]) -> tuple[str, ...]:
    """The awake members a wake waits for to finish their requests: those that arrive meanwhile wait
    (for the member's next turn) rather than keep it busy, so the swap comes (arrivals earlier are served)."""
    if not isinstance(decision, Wait):
        return ()
    awake = {m.name for m in members if m.state is MemberState.AWAKE and m.in_flight > 0}
    return tuple(name for name in decision.waits_for if name in awake)


def idle_sleep_in(member: Member, limit: float | None, now: float) -> float | None:
    """Seconds until an awake member sleeps for want of requests (0: due now); None when it never does now
    (asleep, pinned, serving a request, or no idle_sleep_seconds)."""
    if member.state is not MemberState.AWAKE or member.pinned or member.in_flight > 0 or limit is None:
        return None
    return max(0.0, limit - (now - member.last_used))


def idle_sleepers(members: Sequence[Member], idle_seconds: Mapping[str, float | None], now: float) -> list[str]:
    """Awake members without requests for at least their idle_sleep_seconds (None: never), oldest first."""
    due = [m for m in members if idle_sleep_in(m, idle_seconds.get(m.name), now) == 0.0]
    return [m.name for m in sorted(due, key=lambda m: (m.last_used, m.name))]


class SleepLevel(StrEnum):
    LEVEL_1 = "1"
    """Weights copied to pinned CPU RAM, KV cache dropped: the fastest wake."""
    LEVEL_2 = "2"
    """Weights and KV cache dropped: the wake reloads the weights (staged wake, reload_weights)."""
    STOP = "stop"
    """No sleep mode: stop the server and boot it again (learned KV bytes and compile cache keep it fast)."""
    SUSPEND = "suspend"
    """Level 1, then a GPU checkpoint of the server's CUDA processes: 0 bytes left on the GPU (swap_suspend)."""


@dataclass(frozen=True)
class LevelChoice:
    level: SleepLevel
    reason: str


def sleep_level(
    weights_bytes: int,
    available_ram_bytes: int,
    *,
    sleep_mode: bool,
    level_2: bool,
    reserve_bytes: int = 4 << 30,
) -> LevelChoice:
    """Level 1 when the host's available RAM holds the weights (beside a reserve for everything
    else), else level 2 where the release has it, else stop and boot.

    sleep_mode: the vLLM release has `--enable-sleep-mode` (the catalogue) and the server answers
    `/is_sleeping` (a 404 there means it was started without it); level_2: the release wakes from
    level 2 (reload of the weights).
    """
    gib = 1 << 30
    if not sleep_mode:
        return LevelChoice(SleepLevel.STOP, "the server has no sleep mode: stop it and boot again when needed")
    room = available_ram_bytes - reserve_bytes
    if weights_bytes <= room:
        return LevelChoice(
            SleepLevel.LEVEL_1,
            f"{weights_bytes / gib:.1f} GiB of weights fit in {room / gib:.1f} GiB of available RAM "
            f"(after a {reserve_bytes / gib:.0f} GiB reserve)",
        )
    if level_2:
        return LevelChoice(
            SleepLevel.LEVEL_2,
            f"{weights_bytes / gib:.1f} GiB of weights exceed the {max(room, 0) / gib:.1f} GiB of RAM available "
            "for them: they are dropped and reloaded on wake",
        )
    return LevelChoice(
        SleepLevel.STOP,
        f"the weights do not fit in RAM ({weights_bytes / gib:.1f} GiB > {max(room, 0) / gib:.1f} GiB) and this "
        "release has no level 2: stop and boot",
    )


def forced_level(level: str, *, sleep_mode: bool) -> LevelChoice:
    """The level a deployment's `sleep_level` setting names (stop where the server has no sleep mode)."""
    if level == "stop":
        return LevelChoice(SleepLevel.STOP, "sleep_level = stop: stop it and boot again when needed")
    if not sleep_mode:
        return LevelChoice(SleepLevel.STOP, f"sleep_level = {level}, but the server has no sleep mode: stop and boot")
    return LevelChoice(SleepLevel(level), f"sleep_level = {level} (set in config)")


def sleeps_after_first_boot(name: str, boot_order: Sequence[str]) -> bool:
    """At start-up members boot one at a time on their shared GPUs; each but the first is put to
    sleep once ready, so the next one finds its memory free."""
    return bool(boot_order) and name != boot_order[0]


def joins_asleep(group: str | None, running_groups: Iterable[str | None]) -> bool:
    """A member added by a reload (or enabled) joins asleep, by stop, when its group already runs:
    its first boot would put the awake members to sleep, so its first request boots it instead. A
    new group's members boot as at start-up."""
    return group is not None and group in set(running_groups)


_COORDINATOR_SETTINGS = ("pinned", "idle_sleep_seconds", "min_awake_seconds", "sleep_check_margin_bytes")
"""Read by the swap coordinator and the swap checks only, never by the plan: a change of them needs no new server."""


def server_unchanged(old: DeploymentSettings, new: DeploymentSettings) -> bool:
    """The two settings plan the same server: they differ at most in what only swapping reads (pinned,
    idle_sleep_seconds, and sleep_level among auto, 1 and 2; stop drops sleep mode from the plan)."""
    same = {field: getattr(new, field) for field in _COORDINATOR_SETTINGS}
    if "stop" not in (old.sleep_level, new.sleep_level):
        same["sleep_level"] = new.sleep_level
    return old.model_copy(update=same) == new
