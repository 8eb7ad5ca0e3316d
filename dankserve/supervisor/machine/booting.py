"""Handlers from a request to a started workload: weights, image, planning (and adopting), GPUs, memory, port, start."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from dankserve.state import LearnedKv
from dankserve.supervisor import learning, policy
from dankserve.supervisor.lifecycle import Phase
from dankserve.supervisor.machine.commands import (
    AcquireGpus,
    Command,
    EnsureImage,
    FollowLogs,
    PlanBoot,
    ReadFreeMemory,
    RecordFailure,
    ReleaseGpus,
    RemoveLauncher,
    RemoveWorkload,
    RestoreSnapshot,
    SetRemediation,
    SleepServer,
    StartWorkload,
    StopServer,
    StopWorkload,
    WakeServer,
    note,
)
from dankserve.supervisor.machine.events import (
    Begin,
    BootPlanned,
    FreeMemoryRead,
    GpusAcquired,
    ImageReady,
    LauncherLost,
    PortBusy,
    PortFree,
    Reconfigured,
    StopRequested,
    WeightsFailed,
    WeightsProgress,
    WeightsReady,
    WorkloadStarted,
)
from dankserve.supervisor.machine.outcomes import (
    Step,
    begin_boot,
    fail,
    retry_later,
    teardown,
)
from dankserve.supervisor.machine.snapshots import planned, restores
from dankserve.supervisor.machine.stages import (
    SleepLevel,
    Stage,
)
from dankserve.supervisor.machine.state import (
    Boot,
    BootOverrides,
    LastFailure,
    MachineState,
    SleepRecord,
)
from dankserve.supervisor.machine.timing import (
    FREE_MEMORY_RETRY_SECONDS,
    MAX_IDLE_SECONDS,
    PORT_RECHECK_SECONDS,
)
from dankserve.supervisor.policy import FailureCause


def on_begin(state: MachineState, event: Begin, now: float) -> Step:
    if event.asleep:
        # Its first boot would put the group's awake members to sleep: the first request boots it.
        swap = replace(state.swap, level="stop", since=None, wake_wanted=False)
        after = replace(state, stage=Stage.ASLEEP, boot=None, swap=swap, wake_at=None)
        return after, (
            note("joined_asleep", reason="added by a reload to a running swap group: its first request boots it"),
        )
    return begin_boot(state, now)


def on_stop(state: MachineState, event: StopRequested, now: float) -> Step:
    commands = teardown(state, keep_launcher=event.keep_launcher)
    if not event.keep_launcher and not any(isinstance(c, RemoveWorkload) for c in commands):
        # No running server to remove with it (asleep by stop, backing off, planning...): a launcher
        # kept for the next boot may still run.
        commands = (RemoveLauncher(), *commands)
    return replace(state, stage=Stage.STOPPED, boot=None, pending=None, wake_at=None, message=None), commands


def on_reconfigured(state: MachineState, event: Reconfigured, now: float) -> Step:
    commands = (*teardown(state), SetRemediation({}, ()))
    fresh = replace(
        state,
        config=event.config,
        overrides=BootOverrides(),
        remediated=frozenset(),
        relearned=False,
        failures=(),
        retry_attempts=0,
    )
    if state.stage is Stage.ASLEEP and event.swap_member:
        # Booting now would put the awake members to sleep: the server planned with the old
        # configuration stops (a launcher stays), and the next request boots with the new one.
        swap = replace(state.swap, level="stop", since=None, wake_wanted=False)
        kept = note(
            "reload_kept_asleep",
            sleep_level_was=state.swap.level,
            reason="its configuration changed while asleep: its server is stopped, and its next request boots it "
            "with the new configuration (booting now would put the awake members to sleep)",
        )
        return replace(fresh, boot=None, swap=swap, wake_at=None), (kept, *commands)
    after, begin = begin_boot(fresh, now)
    return after, (*commands, *begin)


def on_weights_progress(state: MachineState, event: WeightsProgress, now: float) -> Step:
    boot = state.boot or Boot(started_at=now)
    facts = replace(boot.facts, weights_percent=max(0, min(100, event.percent)))
    return replace(state, boot=replace(boot, facts=facts)), ()


def on_weights_ready(state: MachineState, event: WeightsReady, now: float) -> Step:
    return replace(state, stage=Stage.PULLING), (EnsureImage(),)


def on_weights_failed(state: MachineState, event: WeightsFailed, now: float) -> Step:
    if event.permanent:  # no such model or revision, or gated without a token: a configuration error
        cause = FailureCause.MODEL_NOT_FOUND
        verdict = policy.restart_or_give_up(policy.Refusal(event.message), now, state.config.restart)
        after, commands = fail(state, verdict.reason, cause.value)
        after = replace(after, last_failure=LastFailure(cause.value, event.message, now))
        return after, (RecordFailure(cause.value, event.message), *commands)
    return retry_later(state, event.message, now)


def on_image_ready(state: MachineState, event: ImageReady, now: float) -> Step:
    version = event.vllm_version or state.vllm_version
    digest = event.digest or state.image_digest
    entrypoint = event.entrypoint if event.entrypoint is not None else state.image_entrypoint
    after = replace(state, stage=Stage.PLANNING, vllm_version=version, image_digest=digest, image_entrypoint=entrypoint)
    return after, (PlanBoot(state.overrides, event.vllm_version, event.digest),)


def on_boot_planned(state: MachineState, event: BootPlanned, now: float) -> Step:
    boot = replace(
        state.boot or Boot(started_at=now),
        uuids=event.uuids,
        boot_key=event.boot_key,
        learned=event.learned,
        planned_utilization=event.planned_utilization,
        band_top=event.band_top,
        snapshot=event.snapshot,
    )
    state = replace(state, gpu_uuids=event.uuids, vllm_version=event.vllm_version or state.vllm_version)
    if event.snapshot is not None:
        failure = event.snapshot.discarded or state.snapshot.last_failure
        verdict = planned(state, event.snapshot)
        boot = replace(boot, snapshot=verdict)
        state = replace(state, snapshot=replace(state.snapshot, plan=verdict, last_failure=failure))
    existing = event.existing
    launcher = existing.launcher if existing is not None else None
    server_runs = launcher is None or (launcher.server_running and launcher.server is not None)
    adopt = existing is not None and existing.running and existing.same_plan and event.adoptable and server_runs
    unfinished = unfinished_swap(event, adopt=adopt, waking=state.swap.since is not None)
    if unfinished is not None:
        return finish_swap(state, boot, event, unfinished, now)
    asleep = found_asleep(event, adopt=adopt, waking=state.swap.since is not None)
    if asleep is not None:
        return adopt_asleep(state, boot, event, asleep)
    if adopt and existing is not None:
        # An adopted boot keeps its GPUs' slot (claimed at start-up) until ready.
        boot = replace(
            boot,
            workload_id=existing.id,
            adopted=True,
            deadline=now + state.config.boot_timeout_seconds,
            phase=Phase.STARTING,
            server=launcher.server if launcher is not None else None,
        )
        adopted = replace(state, stage=Stage.BOOTING, boot=boot, wake_at=now + MAX_IDLE_SECONDS)
        return adopted, (
            note("adopting", container_id=existing.id, server=boot.server),
            FollowLogs(existing.id, server=boot.server),
        )
    commands: list[Command] = [ReleaseGpus()]
    if existing is not None and existing.running and launcher is not None and launcher.reusable:
        # launcher: the same container-level settings: keep it, stop its old server, ask it for a new one.
        boot = replace(boot, launcher_id=existing.id)
        commands.append(note("reusing_launcher", container_id=existing.id, server_running=launcher.server_running))
        if launcher.server_running and launcher.server is not None:
            commands.append(StopServer(existing.id, launcher.server))
    elif existing is not None:
        commands += [
            note("replacing", container_id=existing.id, running=existing.running),
            StopWorkload(existing.id),
            RemoveWorkload(existing.id),
        ]
    commands.append(AcquireGpus(event.uuids))
    return replace(state, stage=Stage.WAITING_GPUS, boot=boot), tuple(commands)


def found_asleep(event: BootPlanned, *, adopt: bool, waking: bool) -> SleepLevel | None:
    """The level a swap group member an earlier daemon (killed with -9) left asleep sleeps at, else None.

    `adopt`: its server runs and may be adopted. The state file remembers the level; the server's
    /is_sleeping has the last word on whether it sleeps (level unknown: 2, whose staged wake with
    reload_weights serves both levels). Asleep by stop there is no server: nothing, a stopped
    workload, or a launcher without one, is found. A wake by booting (`waking`) plans afresh."""
    remembered = event.remembered_asleep
    if waking:
        return None
    if adopt:
        if event.sleeping is False or (event.sleeping is None and remembered not in ("1", "2", "suspend")):
            return None
        return remembered if remembered in ("1", "2", "suspend") else "2"
    existing = event.existing
    launcher = existing.launcher if existing is not None else None
    kept = launcher is not None and existing is not None and existing.running and launcher.reusable
    if remembered == "stop" and (existing is None or (kept and launcher is not None and not launcher.server_running)):
        return "stop"
    return None


def unfinished_swap(event: BootPlanned, *, adopt: bool, waking: bool) -> SleepRecord | None:
    """The sleep or wake an earlier daemon (killed with -9) left under way, to be done again, else None.

    The state file records the move before /sleep or /wake_up is sent, and the server finishes
    what it was sent after the daemon is gone. Both are safe to send again: a second /sleep of
    a sleeping server and a /wake_up of awake memory do nothing, and the staged level-2 wake
    reloads the weights whichever of its steps the kill interrupted (woken without
    reload_weights they are garbage). Meanwhile the member counts as holding its GPU memory. A
    server that says it sleeps after a sleep is adopted asleep (`found_asleep`); `adopt`: its
    server runs and may be adopted; a wake by booting (`waking`) plans afresh.

    A member asleep (or falling asleep) by stop whose workload is left behind not running was killed
    during the stop, or between the stop and the removal. Podman says a container that is still
    stopping is not running while its server tears down and holds its GPU memory, so the stop is done
    again (it waits for the teardown) and the workload removed before the member counts as asleep."""
    level, moving = event.remembered_asleep, event.remembered_moving
    existing = event.existing
    if not waking and level == "stop" and existing is not None and not existing.running:
        return SleepRecord("stop", "falling_asleep")
    if not adopt or waking or level is None or moving is None:
        return None
    if moving == "falling_asleep" and event.sleeping is True and level not in ("stop", "suspend"):
        return None  # asleep already (a suspend's GPU checkpoint may not be done: sent again, by the GPU states)
    return SleepRecord(level, moving)


def finish_swap(state: MachineState, boot: Boot, event: BootPlanned, record: SleepRecord, now: float) -> Step:
    """Adopted falling asleep or waking as the earlier daemon left it: the same sleep or wake is sent again.
    A workload that no longer runs (a stop left unfinished) is stopped and removed as a whole, its logs not followed."""
    existing = event.existing
    assert existing is not None and record.moving is not None  # unfinished_swap: a workload
    running = existing.running
    server = existing.launcher.server if existing.launcher is not None and running else None
    boot = replace(boot, workload_id=existing.id, adopted=True, phase=Phase.READY, server=server)
    swap = replace(state.swap, level=record.level, since=now, wake_wanted=False)
    command: Command = (
        SleepServer(existing.id, record.level, server=server)
        if record.moving == "falling_asleep"
        else WakeServer(existing.id, record.level)
    )
    after = replace(state, stage=Stage(record.moving), boot=boot, swap=swap, wake_at=None)
    follow: tuple[Command, ...] = (FollowLogs(existing.id, server=server),) if running else ()
    return after, (
        note(f"adopting_{record.moving}", sleep_level=record.level, container_id=existing.id, server=server),
        *follow,
        ReleaseGpus(),
        command,
    )


def adopt_asleep(state: MachineState, boot: Boot, event: BootPlanned, level: SleepLevel) -> Step:
    """Asleep as the earlier daemon left it: the server (if any) is followed, not woken; the GPUs' slot goes back."""
    swap = replace(state.swap, level=level, since=None, wake_wanted=False)
    existing = event.existing
    if level == "stop" or existing is None:  # the wake boots (through the kept launcher, if any)
        after = replace(state, stage=Stage.ASLEEP, boot=None, swap=swap, wake_at=None)
        container = existing.id if existing is not None else None
        return after, (note("adopting_asleep", sleep_level=level, container_id=container), ReleaseGpus())
    launcher = existing.launcher
    server = launcher.server if launcher is not None else None
    boot = replace(boot, workload_id=existing.id, adopted=True, phase=Phase.READY, server=server)
    after = replace(state, stage=Stage.ASLEEP, boot=boot, swap=swap, wake_at=None)
    return after, (
        note("adopting_asleep", sleep_level=level, container_id=existing.id, server=server),
        FollowLogs(existing.id, server=server),
        ReleaseGpus(),
    )


def on_gpus_acquired(state: MachineState, event: GpusAcquired, now: float) -> Step:
    boot = state.boot or Boot(started_at=now)
    if restores(boot):  # a valid snapshot: restored instead of a boot (issue 41)
        return replace(state, stage=Stage.STARTING, boot=boot), (note("restoring_snapshot"), RestoreSnapshot())
    boot = replace(boot, settle_until=now + state.config.gpu_memory_settle_seconds)
    return replace(state, stage=Stage.MEASURING, boot=boot), (ReadFreeMemory(boot.uuids, settle_first=True),)


def kv_decision(learned: LearnedKv | None, free: Sequence[int | None]) -> learning.KvDecision:
    """`learning.decide_kv_reuse`, where a GPU whose free memory is unknown never passes the guard."""
    unknown = [i for i, value in enumerate(free) if value is None]
    if unknown:
        return learning.KvDecision(
            None,
            f"free memory of GPU {unknown[0]} is unknown (the reading failed): "
            + ("vLLM profiles memory" if learned is not None else "no KV size learned yet: vLLM profiles memory"),
        )
    return learning.decide_kv_reuse(learned, [value for value in free if value is not None])


def on_free_memory(state: MachineState, event: FreeMemoryRead, now: float) -> Step:
    boot = state.boot or Boot(started_at=now)
    decision = kv_decision(boot.learned, event.free)
    if decision.use_bytes is None and boot.learned is not None and now < boot.settle_until:
        # A server that just died frees its memory a few seconds later: read again before profiling.
        return replace(state, wake_at=now + FREE_MEMORY_RETRY_SECONDS), ()
    known = None if any(value is None for value in event.free) else tuple(v for v in event.free if v is not None)
    boot = replace(boot, baseline=known, learned_used=decision.use_bytes)
    overrides = replace(state.overrides, kv_cache_memory_bytes=decision.use_bytes)
    after = replace(
        state, stage=Stage.STARTING, boot=boot, wake_at=None, kv_cache_learned_used=decision.use_bytes is not None
    )
    return after, (
        note("kv_cache_decision", use_bytes=decision.use_bytes, reason=decision.reason),
        StartWorkload(overrides, state.vllm_version, launcher_id=boot.launcher_id),
    )


def on_port_busy(state: MachineState, event: PortBusy, now: float) -> Step:
    """The port is held: no boot, no failure; looked at again every PORT_RECHECK_SECONDS (said once per holder)."""
    recheck = now + PORT_RECHECK_SECONDS
    if state.stage is Stage.RETRY_WAIT and state.port_holder == event.holder:
        return replace(state, wake_at=recheck), ()
    why = f"port {event.port} is in use by {event.holder}"
    after = replace(
        state,
        stage=Stage.RETRY_WAIT,
        port_holder=event.holder,
        wake_at=recheck,
        pending=None,
        message=f"{why}; fix: stop that process, or give this deployment another `port` in the config; "
        "it starts as soon as the port is free",
    )
    return after, (ReleaseGpus(), note("port_in_use", "warning", error=why, port=event.port))


def on_port_free(state: MachineState, event: PortFree, now: float) -> Step:
    after, commands = begin_boot(state, now)
    return after, (note("port_free", port_holder=state.port_holder), *commands)


def on_workload_started(state: MachineState, event: WorkloadStarted, now: float) -> Step:
    boot = replace(
        state.boot or Boot(started_at=now),
        workload_id=event.workload_id,
        deadline=now + state.config.boot_timeout_seconds,
        phase=Phase.STARTING,
        server=event.server,
    )
    after = replace(state, stage=Stage.BOOTING, boot=boot, boots=event.boot, wake_at=now + MAX_IDLE_SECONDS)
    return after, (
        note("started", container_id=event.workload_id, boot=event.boot, server=event.server),
        FollowLogs(event.workload_id, server=event.server),
    )


def on_launcher_lost(state: MachineState, event: LauncherLost, now: float) -> Step:
    """launcher: the one planning kept did not answer: remove it and start a new workload instead."""
    boot = state.boot or Boot(started_at=now)
    lost = boot.launcher_id
    boot = replace(boot, launcher_id=None)
    overrides = replace(state.overrides, kv_cache_memory_bytes=boot.learned_used)
    commands: list[Command] = [note("launcher_lost", "warning", container_id=lost, error=event.message)]
    if lost is not None:
        commands += [StopWorkload(lost), RemoveWorkload(lost, best_effort=True)]
    return replace(state, boot=boot), (*commands, StartWorkload(overrides, state.vllm_version))
