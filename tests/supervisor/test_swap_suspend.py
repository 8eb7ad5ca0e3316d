"""Zero-residual sleep (issue 41 item 7), pure: the planner's choice of `suspend` (asked for, or memory tight;
never where the GPU checkpoint cannot run, said as the reason), the next safe level when suspend is marked
unsafe, NVML's verdict on a suspended member (0 bytes), and the lifecycle machine's transitions (a suspend
that fell back to level 1, a failed GPU restore on wake, a member adopted suspended). The real daemon is in
test_swap_suspend_process.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from dankserve.state import DeploymentState, UnsafeSleep
from dankserve.supervisor import machine as m
from dankserve.supervisor.fleet import coordinate as c
from dankserve.supervisor.fleet import swap_suspend
from dankserve.supervisor.fleet.coordinator import FleetCoordinator, PlanFacts
from dankserve.supervisor.fleet.swap import LevelChoice, SleepLevel
from dankserve.supervisor.fleet.swap_checks import SUSPENDED_BYTES, check_sleep, safe_level
from dankserve.supervisor.fleet.swap_suspend import GpuShare, SuspendReadings
from dankserve.supervisor.observe.swap_history import SwapCheck
from dankserve.testing.lifecycle import FakeClock
from tests.supervisor.test_fleet_coordinator import Daemon, world
from tests.supervisor.test_machine import _found, in_stage, with_boot
from tests.supervisor.test_swap_verify import target, verifier

GIB = 1 << 30
LEVEL_1 = LevelChoice(SleepLevel.LEVEL_1, "weights fit in RAM")


# -- the choice --------------------------------------------------------------------------------------------------
def test_memory_is_tight_when_the_woken_member_would_not_fit_beside_the_sleepers_leftovers() -> None:
    roomy = GpuShare("GPU-0", 80 * GIB, waker_bytes=72 * GIB, awake_bytes=0, asleep_bytes=2 * GIB, sleeper_bytes=GIB)
    assert swap_suspend.tight([roomy]) is None
    small = GpuShare("GPU-0", 8 * GIB, waker_bytes=int(7.2 * GIB), awake_bytes=0, asleep_bytes=0, sleeper_bytes=GIB)
    why = swap_suspend.tight([roomy, small])
    assert why == (
        "on GPU GPU-0 the woken member's 7.20 GiB beside 0.00 GiB awake and 1.00 GiB kept by sleepers "
        "exceed its 8.00 GiB"
    )
    many = GpuShare("GPU-1", 80 * GIB, 40 * GIB, awake_bytes=36 * GIB, asleep_bytes=3 * GIB, sleeper_bytes=GIB + 1)
    assert swap_suspend.tight([many]) is not None


@pytest.mark.parametrize(
    ("base", "setting", "unavailable", "tight", "level", "said"),
    [
        (LEVEL_1, "suspend", None, None, SleepLevel.SUSPEND, "sleep_level = suspend (set in config): suspended"),
        (LEVEL_1, "auto", None, "on GPU x ...", SleepLevel.SUSPEND, "memory is tight: on GPU x ...: suspended"),
        (LEVEL_1, "auto", None, None, SleepLevel.LEVEL_1, "weights fit in RAM"),
        (
            LEVEL_1,
            "suspend",
            "cuda-bindings is not installed: pip install 'dankserve[snapshot]'",
            None,
            SleepLevel.LEVEL_1,
            "sleep_level = suspend (set in config), but the GPU checkpoint is unavailable here (cuda-bindings is "
            "not installed: pip install 'dankserve[snapshot]'): level 1",
        ),
        (LEVEL_1, "auto", "no driver", "tight", SleepLevel.LEVEL_1, "memory is tight: tight, but the GPU checkpoint"),
        (LevelChoice(SleepLevel.LEVEL_2, "RAM"), "auto", None, "tight", SleepLevel.LEVEL_2, "RAM"),
        (LevelChoice(SleepLevel.STOP, "no sleep mode"), "suspend", None, None, SleepLevel.STOP, "no sleep mode"),
    ],
)
def test_suspend_is_chosen_where_asked_or_tight_only_over_level_1_and_only_where_the_checkpoint_runs(  # noqa: PLR0917
    base: LevelChoice, setting: str, unavailable: str | None, tight: str | None, level: SleepLevel, said: str
) -> None:
    choice = swap_suspend.choose(base, setting, unavailable=unavailable, tight_reason=tight)
    assert choice.level is level and choice.reason.startswith(said)


def test_a_suspend_marked_unsafe_sleeps_at_level_1_and_then_the_usual_chain() -> None:
    asked = LevelChoice(SleepLevel.SUSPEND, "asked")
    assert safe_level(asked, ()).level is SleepLevel.SUSPEND
    assert safe_level(asked, ("suspend",)) == LevelChoice(
        SleepLevel.LEVEL_1, "level suspend marked unsafe for this vLLM and model: 1"
    )
    assert safe_level(asked, ("suspend", "1")).level is SleepLevel.LEVEL_2


def test_a_suspended_member_must_hold_0_bytes() -> None:
    passed = check_sleep({"GPU-0": 0}, SUSPENDED_BYTES)
    assert passed.released and passed.message == "0 bytes held suspended (its GPU checkpoint released everything)"
    kept = check_sleep({"GPU-0": 300 << 20}, SUSPENDED_BYTES)
    assert not kept.released and "suspended, yet its processes still hold 0.29 GiB on GPU GPU-0" in kept.message


def _readings(unavailable: str | None = None, total: int = 8 * GIB, held: int = 0) -> SuspendReadings:
    return SuspendReadings(
        unavailable=lambda: unavailable,
        totals=lambda uuids: dict.fromkeys(uuids, total),
        held=lambda name: {"GPU-0": held},
    )


def _coordinator(daemon: Daemon, readings: SuspendReadings | None) -> FleetCoordinator:
    groups = FleetCoordinator(daemon, lambda: 64 << 30, FakeClock(), readings)  # type: ignore[arg-type]
    for name in daemon.workers:
        groups.record_plan(name, PlanFacts(0.9, 2 << 30, sleep_mode=True))
    return groups


def test_the_coordinator_suspends_a_sleeper_that_makes_room_on_a_tight_gpu_but_not_an_idle_one() -> None:
    _, daemon = world({"a": (m.Stage.READY, 0.9, {}), "b": (m.Stage.ASLEEP, 0.9, {})})
    groups = _coordinator(daemon, _readings(total=8 * GIB))
    a = daemon.workers["a"]
    assert groups.sleep_level("a", a.machine, waker="b").level is SleepLevel.SUSPEND
    assert groups.sleep_level("a", a.machine).level is SleepLevel.LEVEL_1, "an idle sleep makes room for no one"
    roomy = _coordinator(daemon, _readings(total=80 * GIB))
    assert roomy.sleep_level("a", a.machine, waker="b").level is SleepLevel.LEVEL_1
    crowded = _coordinator(daemon, _readings(total=80 * GIB, held=int(7.5 * GIB)))  # b's leftovers don't count
    assert crowded.sleep_level("a", a.machine, waker="b").level is SleepLevel.LEVEL_1
    unknown = _coordinator(daemon, None)
    assert unknown.sleep_level("a", a.machine, waker="b").level is SleepLevel.LEVEL_1


def test_a_wake_feeds_the_sleeper_suspend_on_a_tight_gpu_and_the_setting_is_read_with_its_reason() -> None:
    _, daemon = world({"a": (m.Stage.READY, 0.9, {}), "b": (m.Stage.ASLEEP, 0.9, {})})
    groups = _coordinator(daemon, _readings(total=8 * GIB))
    groups.apply(c.Wake("b", "gateway"))
    (fed,) = daemon.workers["a"].fed
    assert fed == m.SleepRequested("suspend", "make room for b")

    _, daemon = world({"a": (m.Stage.READY, 0.5, {"sleep_level": "suspend"})})
    asked = _coordinator(daemon, _readings(unavailable="cuda-bindings is not installed"))
    choice = asked.sleep_level("a", daemon.workers["a"].machine)
    assert choice.level is SleepLevel.LEVEL_1 and "unavailable here (cuda-bindings is not installed)" in choice.reason
    daemon.state.records["a"] = DeploymentState(unsafe_sleep=(UnsafeSleep("suspend", None, "m", "801", 0.0),))
    assert _coordinator(daemon, _readings()).sleep("a", "by hand") is None
    (fed,) = daemon.workers["a"].fed
    assert fed == m.SleepRequested("1", "by hand"), "suspend marked unsafe for it: level 1"


def test_a_member_on_more_than_one_gpu_is_never_suspended() -> None:
    _, daemon = world({"a": (m.Stage.READY, 0.5, {"sleep_level": "suspend"})})
    two = replace(daemon.workers["a"].machine, gpu_uuids=("GPU-0", "GPU-1"))
    choice = _coordinator(daemon, _readings()).sleep_level("a", two)
    assert choice.level is SleepLevel.LEVEL_1 and "more than one GPU (TP > 1" in choice.reason


def test_the_coordinate_tells_whom_a_sleep_makes_room_for() -> None:
    groups, _ = world({"a": (m.Stage.READY, 0.9, {}), "b": (m.Stage.ASLEEP, 0.9, {})})
    view = groups._view()
    _, directives = c.coordinate(c.FleetState(), view, c.Wake("b", "gateway"), 100.0)
    assert c.FeedSleep("a", "make room for b", waker="b") in directives


# -- the machine -------------------------------------------------------------------------------------------------
def test_a_suspend_sleeps_and_wakes_through_the_worker_at_level_suspend() -> None:
    ready = with_boot(in_stage(m.Stage.READY), workload_id="w1")
    falling, commands = m.step(ready, m.SleepRequested("suspend", "room"), 1.0)
    assert commands[-1] == m.SleepServer("w1", "suspend")
    asleep, _ = m.step(falling, m.FellAsleep(0.4), 1.4)
    assert asleep.stage is m.Stage.ASLEEP and asleep.swap.level == "suspend" and asleep.swap.last_level == "suspend"
    assert asleep.sleep_record == m.SleepRecord("suspend")
    waking, commands = m.step(asleep, m.WakeRequested(), 2.0)
    assert waking.stage is m.Stage.WAKING and commands[-1] == m.WakeServer("w1", "suspend")


@pytest.mark.parametrize("lasting", [True, False])
def test_a_suspend_whose_checkpoint_failed_sleeps_at_level_1_with_the_reason(lasting: bool) -> None:
    ready = with_boot(in_stage(m.Stage.READY), workload_id="w1")
    falling, _ = m.step(ready, m.SleepRequested("suspend", "room"), 1.0)
    asleep, commands = m.step(falling, m.SuspendFailed(0.3, "CUDA_ERROR_NOT_SUPPORTED", lasting), 1.3)
    assert asleep.stage is m.Stage.ASLEEP and asleep.swap.level == "1" and asleep.swap.last_level == "1"
    assert asleep.swap.suspend_failure == "CUDA_ERROR_NOT_SUPPORTED" and asleep.swap.last_sleep_seconds == 0.3
    marked = m.MarkSleepUnsafe("suspend", "CUDA_ERROR_NOT_SUPPORTED") in commands
    assert marked is lasting
    waking, commands = m.step(asleep, m.WakeRequested(), 2.0)
    assert commands[-1] == m.WakeServer("w1", "1"), "nothing to restore: the plain level-1 wake"
    awake, _ = m.step(waking, m.WokeUp(0.2), 2.2)
    again, _ = m.step(awake, m.SleepRequested("1", "idle"), 3.0)
    assert again.swap.suspend_failure is None


def test_a_suspend_with_a_wake_asked_meanwhile_wakes_at_once_at_level_1() -> None:
    ready = with_boot(in_stage(m.Stage.READY), workload_id="w1")
    falling, _ = m.step(ready, m.SleepRequested("suspend", "room"), 1.0)
    kept, _ = m.step(falling, m.WakeRequested(), 1.1)
    waking, commands = m.step(kept, m.SuspendFailed(0.3, "lock timeout"), 1.3)
    assert waking.stage is m.Stage.WAKING and commands[-1] == m.WakeServer("w1", "1")


def test_a_failed_gpu_restore_is_a_failed_wake_the_member_restarted_and_suspend_marked_unsafe() -> None:
    ready = with_boot(in_stage(m.Stage.READY), workload_id="w1")
    falling, _ = m.step(ready, m.SleepRequested("suspend", "room"), 1.0)
    asleep, _ = m.step(falling, m.FellAsleep(0.4), 1.4)
    waking, _ = m.step(asleep, m.WakeRequested(), 2.0)
    after, commands = m.step(waking, m.WakeFailed("the GPU restore failed: CUDA_ERROR_OUT_OF_MEMORY"), 2.5)
    assert after.stage is m.Stage.DECIDING and after.pending is not None  # the failure policy restarts it
    assert after.pending.message == "wake failed: the GPU restore failed: CUDA_ERROR_OUT_OF_MEMORY"
    assert m.StopWorkload("w1") in commands
    assert any(isinstance(x, m.MarkSleepUnsafe) and x.level == "suspend" and x.check == "wake" for x in commands)


def test_a_member_left_suspended_by_a_killed_daemon_is_adopted_suspended() -> None:
    after, _ = m.step(in_stage(m.Stage.PLANNING), _found(True, "suspend"), 1.0)
    assert after.stage is m.Stage.ASLEEP and after.swap.level == "suspend"
    _, commands = m.step(after, m.WakeRequested(), 2.0)
    assert commands[-1] == m.WakeServer("w9", "suspend"), "restored and unlocked by their states, then woken"


def test_a_suspend_left_under_way_by_a_killed_daemon_is_sent_again_even_when_the_server_sleeps() -> None:
    """Its GPU checkpoint may not be done: the next daemon adopts it falling asleep and sends the suspend again
    (the worker skips /sleep for a server asleep; the GPU steps follow each process's state)."""
    after, commands = m.step(in_stage(m.Stage.PLANNING), _found(True, "suspend", "falling_asleep"), 1.0)
    assert after.stage is m.Stage.FALLING_ASLEEP and commands[-1] == m.SleepServer("w9", "suspend")
    plain, _ = m.step(in_stage(m.Stage.PLANNING), _found(True, "1", "falling_asleep"), 1.0)
    assert plain.stage is m.Stage.ASLEEP, "a level-1 sleep left under way is asleep already"


# -- the check -----------------------------------------------------------------------------------------------
def test_a_suspend_is_checked_against_0_bytes_and_one_that_fell_back_as_a_level_1_sleep(tmp_path: Path) -> None:
    """0 bytes: the sleep passes; the context still listed (after the settle): SleepKeptMemory; a suspend that
    fell back to level 1 is held to level 1's tolerance (its CUDA context)."""
    readings = [{"GPU-0": 0}]
    check = verifier(tmp_path, None, [(1, 2)])
    check._held = lambda pids, uuids: readings[0]
    checks: list[SwapCheck] = []
    assert check.sleep(target(), lambda: m.FellAsleep(0.3), checks, suspend=True) == m.FellAsleep(0.3)
    assert checks == [
        SwapCheck("memory", "passed", "0 bytes held suspended (its GPU checkpoint released everything)", 0)
    ]
    readings[0] = {"GPU-0": 500 << 20}
    kept = check.sleep(target(), lambda: m.FellAsleep(0.3), suspend=True)
    assert isinstance(kept, m.SleepKeptMemory) and kept.held_bytes == 500 << 20
    fell_back = m.SuspendFailed(0.3, "CUDA_ERROR_NOT_SUPPORTED", lasting=True)
    assert check.sleep(target(), lambda: fell_back, suspend=True) == fell_back
