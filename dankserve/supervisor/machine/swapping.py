"""Swap groups (issue 16): handlers that put a ready server to sleep and wake it."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from dankserve.supervisor.machine.commands import (
    Command,
    MarkSleepUnsafe,
    ReleaseGpus,
    SleepServer,
    WakeServer,
    note,
)
from dankserve.supervisor.machine.events import (
    FellAsleep,
    SleepFailed,
    SleepKeptMemory,
    SleepRequested,
    SleepUnsupported,
    SuspendFailed,
    WakeFailed,
    WakeRequested,
    WokeUp,
    WokeWrong,
)
from dankserve.supervisor.machine.outcomes import (
    Step,
    begin_boot,
    decide_after,
    teardown,
)
from dankserve.supervisor.machine.stages import (
    Stage,
)
from dankserve.supervisor.machine.state import (
    Failure,
    MachineState,
    SwapTimes,
)
from dankserve.supervisor.policy import FailureCause


def swap_done(swap: SwapTimes, kind: Literal["sleep", "wake"], now: float) -> SwapTimes:
    """The swap record once a sleep or a wake that began at `swap.since` ended at `now`."""
    seconds = round(now - swap.since, 3) if swap.since is not None else None
    if kind == "sleep":
        return replace(
            swap, since=None, last_sleep_seconds=seconds, last_level=swap.level, last_at=now, last_kind="sleep"
        )
    return replace(
        swap,
        since=None,
        wake_wanted=False,
        last_wake_seconds=seconds,
        last_level=swap.level,
        last_at=now,
        last_kind="wake",
    )


def woke_by_boot(state: MachineState, now: float) -> tuple[Command, ...]:
    """The log line of a wake done by booting (the member slept by being stopped)."""
    if state.swap.since is None:
        return ()
    return (note("woke_up", sleep_level=state.swap.level, seconds=round(now - state.swap.since, 3)),)


def on_sleep_requested(state: MachineState, event: SleepRequested, now: float) -> Step:
    wid = state.workload_id or ""
    swap = replace(state.swap, level=event.level, since=now, wake_wanted=False, suspend_failure=None)
    after = replace(state, stage=Stage.FALLING_ASLEEP, swap=swap, wake_at=None)
    server = state.boot.server if state.boot is not None else None
    return after, (
        note("falling_asleep", sleep_level=event.level, reason=event.reason),
        SleepServer(wid, event.level, server=server),
    )


def on_fell_asleep(state: MachineState, event: FellAsleep, now: float) -> Step:
    swap = state.swap
    commands: list[Command] = [note("fell_asleep", sleep_level=swap.level, seconds=round(event.seconds, 3))]
    swap = replace(swap_done(swap, "sleep", now), last_sleep_seconds=round(event.seconds, 3))
    after = replace(state, stage=Stage.ASLEEP, swap=swap, wake_at=None)
    if swap.level == "stop":  # the interpreter stopped the server (and removed it, unless a launcher's)
        after = replace(after, boot=None)
        commands.append(ReleaseGpus())
    if state.swap.wake_wanted:
        woken, more = on_wake_requested(after, WakeRequested(), now)
        return woken, (*commands, *more)
    return after, tuple(commands)


def on_suspend_failed(state: MachineState, event: SuspendFailed, now: float) -> Step:
    """A suspend whose GPU checkpoint failed (issue 41 item 7): undone, the server sleeps at plain level 1 and
    status says why; a failure that will come again marks suspend unsafe (the next sleeps take level 1)."""
    swap = replace(state.swap, level="1", suspend_failure=event.reason)
    after, commands = on_fell_asleep(replace(state, swap=swap), FellAsleep(event.seconds), now)
    marks: tuple[Command, ...] = (MarkSleepUnsafe("suspend", event.reason),) if event.lasting else ()
    return after, (note("suspend_failed", "warning", reason=event.reason, lasting=event.lasting), *marks, *commands)


def on_sleep_unsupported(state: MachineState, event: SleepUnsupported, now: float) -> Step:
    swap = replace(state.swap, level="stop")
    return replace(state, swap=swap), (
        note("sleep_unsupported", "warning", reason=event.reason),
        SleepServer(state.workload_id or "", "stop", server=state.boot.server if state.boot is not None else None),
    )


def on_sleep_kept_memory(state: MachineState, event: SleepKeptMemory, now: float) -> Step:
    """A sleep NVML does not believe: the level is marked unsafe and the server stopped instead (issue 29)."""
    level = state.swap.level or "1"
    server = state.boot.server if state.boot is not None else None
    return replace(state, swap=replace(state.swap, level="stop")), (
        note("sleep_kept_memory", "error", sleep_level=level, held_bytes=event.held_bytes, reason=event.message),
        MarkSleepUnsafe(level, event.message),
        SleepServer(state.workload_id or "", "stop", server=server),
    )


def on_woke_wrong(state: MachineState, event: WokeWrong, now: float) -> Step:
    """A wake whose canary answers other tokens: never served; the level is marked unsafe, the server is
    stopped and booted again (the wake is still wanted, so the stop's FellAsleep boots it)."""
    level = state.swap.level or "1"
    server = state.boot.server if state.boot is not None else None
    swap = replace(state.swap, level="stop", wake_wanted=True, since=now)
    return replace(state, stage=Stage.FALLING_ASLEEP, swap=swap, wake_at=None), (
        note("woke_wrong", "error", sleep_level=level, reason=event.message),
        MarkSleepUnsafe(level, event.message, "wake"),
        SleepServer(state.workload_id or "", "stop", server=server),
    )


def on_wake_requested(state: MachineState, event: WakeRequested, now: float) -> Step:
    if state.stage is Stage.FALLING_ASLEEP:
        return replace(state, swap=replace(state.swap, wake_wanted=True)), ()
    swap = replace(state.swap, since=now, wake_wanted=False)
    wid = state.workload_id
    if state.swap.level == "stop" or wid is None:
        after, commands = begin_boot(replace(state, swap=replace(swap, level="stop")), now)
        return after, (note("waking", sleep_level="stop"), *commands)
    return replace(state, stage=Stage.WAKING, swap=swap, wake_at=None), (
        note("waking", sleep_level=swap.level),
        WakeServer(wid, swap.level or "1"),
    )


def on_woke_up(state: MachineState, event: WokeUp, now: float) -> Step:
    boot = state.boot
    swap = replace(swap_done(state.swap, "wake", now), last_wake_seconds=round(event.seconds, 3))
    after = replace(state, stage=Stage.READY, swap=swap, wake_at=now)
    if boot is not None:
        after = replace(after, boot=replace(boot, next_health=now, unhealthy=0))
    return after, (note("woke_up", sleep_level=state.swap.level, seconds=round(event.seconds, 3)),)


def on_swap_failed(state: MachineState, event: SleepFailed | WakeFailed, now: float) -> Step:
    """A sleep or wake that failed: the server is removed and the failure policy restarts it. A wake that
    failed also marks its level unsafe, so the member's next sleeps take the next safe way instead of
    failing each wake until the restart budget is spent (seen on the H200: a level-2 wake with
    `--load-format fastsafetensors` ran out of GPU memory every time)."""
    kind = "sleep" if isinstance(event, SleepFailed) else "wake"
    level = state.swap.level
    swap = replace(state.swap, since=None, wake_wanted=False, level=None)
    failure = Failure(FailureCause.ENGINE_DEAD, f"{kind} failed: {event.message}", state.facts, served=True)
    after, commands = decide_after(replace(state, swap=swap), failure, teardown(state))
    marks: tuple[Command, ...] = ()
    if isinstance(event, WakeFailed) and level in ("1", "2", "suspend"):
        marks = (MarkSleepUnsafe(level, f"the wake failed: {event.message}", "wake"),)
    return after, (note(f"{kind}_failed", "error", error=event.message), *marks, *commands)
