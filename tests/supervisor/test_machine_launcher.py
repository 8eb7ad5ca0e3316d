"""Tests for the launcher's part of dankserve.supervisor.machine: servers come and go, the launcher stays."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dankserve.bootlog.facts import BootFacts
from dankserve.state import LearnedKv
from dankserve.supervisor import machine as m
from dankserve.supervisor.policy import FailureCause
from tests.supervisor.test_machine import CONFIG, LEARNED, in_stage, with_boot


def launched(stage: m.Stage, server: int = 2) -> m.MachineState:
    """A machine in `stage` whose workload `w1` is a launcher running server `server`."""
    return with_boot(in_stage(stage), server=server)


def kinds(commands: tuple[Any, ...]) -> list[type[Any]]:
    return [type(c) for c in commands]


def test_a_crashed_server_keeps_its_launcher() -> None:
    """A launcher's server that exits is a crash as before, and its launcher is not removed."""
    after, commands = m.step(launched(m.Stage.BOOTING), m.Exited(1), 10.0)
    assert after.stage is m.Stage.DECIDING
    assert after.pending is not None and after.pending.cause is FailureCause.CRASH
    assert m.RemoveWorkload not in kinds(commands) and m.StopWorkload not in kinds(commands)


def test_a_dead_launcher_is_removed() -> None:
    """When the launcher itself ended, its workload is removed like a plain server's."""
    after, commands = m.step(launched(m.Stage.BOOTING), m.Exited(137, launcher_gone=True), 10.0)
    assert after.stage is m.Stage.DECIDING
    assert m.RemoveWorkload("w1", best_effort=True) in commands


def test_an_oom_of_a_launcher_server_is_classified_as_before() -> None:
    """An OOM kill the launcher reports reaches the policy as an OOM, not a crash."""
    after, _ = m.step(launched(m.Stage.READY), m.Exited(-9, oom_killed=True), 10.0)
    assert after.pending is not None and "OOM" in (after.pending.message or "")


def test_engine_death_while_serving_stops_only_the_server() -> None:
    """/health 503 while ready fails the boot as engine death and stops the server, not the launcher."""
    state = with_boot(launched(m.Stage.READY), next_health=0.0)
    after, commands = m.step(state, m.HealthChecked(503), 10.0)
    assert after.pending is not None and after.pending.cause is FailureCause.ENGINE_DEAD
    assert m.StopServer("w1", 2) in commands
    assert m.StopWorkload not in kinds(commands)


def test_a_boot_timeout_stops_only_the_server() -> None:
    """A launcher boot that is not ready in time is a boot timeout; its server is stopped."""
    after, commands = m.step(launched(m.Stage.BOOTING), m.Tick(), 1000.0)
    assert after.pending is not None and after.pending.cause is FailureCause.BOOT_TIMEOUT
    assert m.StopServer("w1", 2) in commands


def test_down_keeps_the_launcher_and_sigterm_removes_it() -> None:
    """`dankserve down` stops the server only; a plain stop (SIGTERM) stops and removes the launcher."""
    _, down = m.step(launched(m.Stage.READY), m.StopRequested(keep_launcher=True), 1.0)
    assert m.StopServer("w1", 2) in down and m.RemoveWorkload not in kinds(down)
    _, term = m.step(launched(m.Stage.READY), m.StopRequested(), 1.0)
    assert m.StopWorkload("w1") in term and m.RemoveWorkload("w1") in term


def test_a_reload_stops_the_server_and_plans_again() -> None:
    """A reload stops the server and keeps the launcher; planning then decides whether it fits."""
    _, commands = m.step(launched(m.Stage.READY), m.Reconfigured(CONFIG), 1.0)
    assert m.StopServer("w1", 2) in commands and m.RemoveWorkload not in kinds(commands)


def test_a_reload_of_a_sleeping_member_stops_only_its_server() -> None:
    """Asleep at level 1 under a launcher, its config changed: the server stops, the launcher stays for its wake."""
    asleep = replace(launched(m.Stage.ASLEEP), swap=m.SwapTimes(level="1"))
    after, commands = m.step(asleep, m.Reconfigured(CONFIG, swap_member=True), 1.0)
    assert after.stage is m.Stage.ASLEEP and after.swap.level == "stop"
    assert m.StopServer("w1", 2) in commands
    assert not {m.RemoveWorkload, m.RemoveLauncher, m.StopWorkload} & set(kinds(commands))


def planned(launcher: m.LauncherFound, same_plan: bool = False) -> m.BootPlanned:
    existing = m.ExistingWorkload("L", running=True, same_plan=same_plan, launcher=launcher)
    return m.BootPlanned(("GPU-0",), "kv1-x", LEARNED, "0.8.5", existing=existing)


def test_a_fitting_launcher_is_asked_for_the_next_server() -> None:
    """A running launcher with this boot's container-level settings is kept: its old server is stopped, the
    new boot's StartWorkload names it."""
    state = in_stage(m.Stage.PLANNING)
    after, commands = m.step(state, planned(m.LauncherFound(True, server=4, server_running=True)), 1.0)
    assert after.stage is m.Stage.WAITING_GPUS
    assert m.StopServer("L", 4) in commands and m.RemoveWorkload not in kinds(commands)
    after, _ = m.step(after, m.GpusAcquired(), 2.0)
    after, commands = m.step(after, m.FreeMemoryRead((80 * 2**30,)), 3.0)
    start = [c for c in commands if isinstance(c, m.StartWorkload)]
    assert start and start[0].launcher_id == "L"
    after, commands = m.step(after, m.WorkloadStarted("L", 9, server=5), 4.0)
    assert after.boot is not None and after.boot.server == 5
    assert m.FollowLogs("L", server=5) in commands


def test_a_launcher_with_other_container_settings_is_replaced() -> None:
    """A launcher whose image, GPUs, mounts or ports differ is stopped and removed, as a plain workload is."""
    after, commands = m.step(in_stage(m.Stage.PLANNING), planned(m.LauncherFound(False, 4, True)), 1.0)
    assert m.StopWorkload("L") in commands and m.RemoveWorkload("L") in commands
    assert after.boot is not None and after.boot.launcher_id is None


def test_a_running_server_of_this_plan_is_adopted_with_its_number() -> None:
    """After a daemon kill -9, the launcher's server of this plan is adopted and only its lines are read."""
    after, commands = m.step(in_stage(m.Stage.PLANNING), planned(m.LauncherFound(True, 3, True), True), 1.0)
    assert after.stage is m.Stage.BOOTING and after.boot is not None and after.boot.server == 3
    assert m.FollowLogs("L", server=3) in commands


def test_an_idle_launcher_of_this_plan_is_reused_not_adopted() -> None:
    """A launcher whose server has exited is not adopted: it is asked for a new server."""
    after, commands = m.step(in_stage(m.Stage.PLANNING), planned(m.LauncherFound(True, 3, False), True), 1.0)
    assert after.stage is m.Stage.WAITING_GPUS and after.boot is not None and after.boot.launcher_id == "L"
    assert m.StopServer not in kinds(commands)


def test_a_lost_launcher_is_replaced_by_a_new_workload() -> None:
    """A launcher that does not answer the start is removed and a new workload started in its place."""
    state = with_boot(in_stage(m.Stage.STARTING), launcher_id="L", learned_used=123)
    after, commands = m.step(state, m.LauncherLost("connection refused"), 5.0)
    assert after.stage is m.Stage.STARTING
    assert m.StopWorkload("L") in commands and m.RemoveWorkload("L", best_effort=True) in commands
    start = [c for c in commands if isinstance(c, m.StartWorkload)]
    assert start[0].launcher_id is None and start[0].overrides.kv_cache_memory_bytes == 123


def test_a_broken_log_stream_waits_for_the_server_not_the_launcher() -> None:
    """When a launcher server's lines end, the machine waits for that server's exit."""
    state = with_boot(launched(m.Stage.BOOTING, server=7), log_ended=True)
    _, commands = m.step(state, m.Tick(), 1.0)
    waits = [c for c in commands if isinstance(c, m.WaitExit)]
    assert waits and waits[0].server == 7


def ready_with(learned: LearnedKv, tokens: int) -> tuple[m.MachineState, tuple[Any, ...]]:
    facts = BootFacts(ready=True, kv_cache_memory_bytes=5 * 2**30, gpu_kv_cache_tokens=tokens)
    state = with_boot(in_stage(m.Stage.BOOTING), learned=learned, learned_used=learned.kv_cache_memory_bytes)
    state = with_boot(state, facts=facts)
    warming, _ = m.step(state, m.HealthChecked(200), 5.0)
    return m.step(warming, m.WarmedUp(None, 0.1), 5.1)


def test_a_learned_boot_with_a_smaller_kv_cache_is_said_in_status_and_log() -> None:
    """More than 1 % fewer KV tokens than the profiled boot: status's message and a warning name the fix."""
    learned = replace(LEARNED, kv_cache_tokens=1_000_000)
    after, commands = ready_with(learned, 980_000)
    assert after.stage is m.Stage.READY
    assert after.message is not None and "gpu_memory_utilization" in after.message
    assert any(isinstance(c, m.Note) and c.event == "kv_cache_smaller_than_profiled" for c in commands)
    after, commands = ready_with(learned, 995_000)
    assert after.message is None
    assert not any(isinstance(c, m.Note) and c.event == "kv_cache_smaller_than_profiled" for c in commands)


def test_a_swap_member_stopped_to_sleep_stops_only_its_server() -> None:
    """sleep_level = stop (or no sleep mode) on a launcher's server names it: the launcher stays for the wake."""
    _, commands = m.step(launched(m.Stage.READY), m.SleepRequested("stop", "room"), 1.0)
    assert m.SleepServer("w1", "stop", server=2) in commands
    falling = replace(launched(m.Stage.FALLING_ASLEEP), swap=m.SwapTimes(level="1", since=1.0))
    _, commands = m.step(falling, m.SleepUnsupported("/is_sleeping 404"), 1.0)
    assert m.SleepServer("w1", "stop", server=2) in commands


def test_a_launcher_server_that_dies_asleep_is_waited_for_not_its_launcher() -> None:
    """The server's log ends while asleep: the exit asked about is the server's (the launcher outlives it)."""
    asleep = replace(launched(m.Stage.ASLEEP), swap=m.SwapTimes(level="1"))
    _, commands = m.step(asleep, m.LogEnded(), 1.0)
    assert commands == (m.WaitExit("w1", m.EXIT_WAIT_SECONDS, server=2),)


def test_a_stop_that_does_not_keep_the_launcher_removes_one_left_without_a_server() -> None:
    """SIGTERM (or a removed deployment) while no server runs (asleep by stop, backing off) removes the
    launcher kept for the next boot; `down` keeps it; a running one goes with its workload as before."""
    stopped = replace(in_stage(m.Stage.ASLEEP), boot=None, swap=m.SwapTimes(level="stop"))
    for idle in (stopped, launched(m.Stage.BACKOFF), in_stage(m.Stage.WAITING_GPUS)):
        _, term = m.step(idle, m.StopRequested(), 1.0)
        assert m.RemoveLauncher() in term
        _, down = m.step(idle, m.StopRequested(keep_launcher=True), 1.0)
        assert m.RemoveLauncher() not in down
    _, term = m.step(launched(m.Stage.READY), m.StopRequested(), 1.0)
    assert m.RemoveLauncher() not in term and m.RemoveWorkload("w1") in term
