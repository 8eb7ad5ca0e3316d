"""Handlers of a running workload: its log, health, exit, a timer's look around, the runtime gone."""

from __future__ import annotations

from dataclasses import replace

from dankserve.bootlog.facts import FailureClass
from dankserve.supervisor import learning, policy
from dankserve.supervisor.lifecycle import Phase, advance_boot_phase
from dankserve.supervisor.machine.commands import (
    CheckPort,
    Command,
    FollowLogs,
    ProbeHealth,
    ReadFreeMemory,
    RecordBoot,
    ReleaseGpus,
    WaitExit,
    WakeServer,
    WarmUp,
    note,
)
from dankserve.supervisor.machine.events import (
    BootLog,
    Crashed,
    Exited,
    HealthChecked,
    LivenessFailed,
    LogEnded,
    MemberLost,
    Refused,
    RuntimeUnreachable,
    StillRunning,
    Tick,
    WarmedUp,
)
from dankserve.supervisor.machine.outcomes import (
    Step,
    begin_boot,
    decide_after,
    exited_teardown,
    fail,
    retry_later,
    teardown,
)
from dankserve.supervisor.machine.snapshots import start_capture, wants_capture
from dankserve.supervisor.machine.stages import (
    SLEEP_STAGES,
    Stage,
)
from dankserve.supervisor.machine.state import (
    Failure,
    MachineState,
    Outage,
)
from dankserve.supervisor.machine.swapping import (
    swap_done,
    woke_by_boot,
)
from dankserve.supervisor.machine.timing import (
    EXIT_WAIT_SECONDS,
    HEALTH_RETRY_SECONDS,
    MAX_IDLE_SECONDS,
    PORT_RECHECK_SECONDS,
    UNANSWERED_HEALTH_MESSAGE,
    UNANSWERED_HEALTH_SECONDS,
    WARM_UP_TIMEOUT_SECONDS,
)
from dankserve.supervisor.policy import FailureCause


def on_tick(state: MachineState, event: Tick, now: float) -> Step:
    if state.stage in (Stage.BACKOFF, Stage.RETRY_WAIT):
        if state.wake_at is not None and now < state.wake_at:
            return state, ()
        if state.stage is Stage.RETRY_WAIT and state.port_holder is not None:
            return replace(state, wake_at=now + PORT_RECHECK_SECONDS), (CheckPort(),)
        return begin_boot(state, now)
    if state.stage is Stage.MEASURING:
        boot = state.boot
        if boot is None or state.wake_at is None or now < state.wake_at:
            return state, ()
        return replace(state, wake_at=None), (ReadFreeMemory(boot.uuids, settle_first=False),)
    return watch(state, now)


def on_boot_log(state: MachineState, event: BootLog, now: float) -> Step:
    boot = state.boot
    if boot is None:
        return state, ()
    facts = event.facts
    commands: list[Command] = []
    phase = boot.phase
    if event.phase is not None and state.stage is Stage.BOOTING:
        moved = advance_boot_phase(phase, event.phase)
        if moved is not Phase.READY:  # ready is /health's and the log's together, decided below
            phase = moved
    boot = replace(boot, facts=facts, phase=phase)
    state = replace(
        state,
        boot=boot,
        vllm_version=facts.vllm_version or state.vllm_version,
        compile_cache_hit=facts.compile_cache_hit,
        compile_seconds=facts.compile_seconds,
    )
    if state.stage is Stage.BOOTING and facts.failure is not None and facts.failure != FailureClass.ENGINE_DEAD:
        # vLLM exits after these: give it a moment, then make sure.
        pending = Failure(FailureCause.from_log(facts.failure), facts.failure_message, facts, served=False)
        return replace(state, stage=Stage.ENDING, pending=pending, wake_at=None), (
            *commands,
            WaitExit(boot.workload_id or "", EXIT_WAIT_SECONDS, server=boot.server),
        )
    if state.stage is Stage.BOOTING and facts.ready and boot.up_logged_at is None:
        boot = replace(boot, up_logged_at=now)
        state = replace(state, boot=boot)
    if state.stage is Stage.BOOTING and facts.ready and now >= boot.next_health:
        # This boot's own log says the server is up: ask /health now.
        boot = replace(boot, next_health=now + HEALTH_RETRY_SECONDS)
        return replace(state, boot=boot, wake_at=now + HEALTH_RETRY_SECONDS), (*commands, ProbeHealth(1.0))
    return state, tuple(commands)


def on_log_ended(state: MachineState, event: LogEnded, now: float) -> Step:
    boot = state.boot
    if boot is None:
        return state, ()
    state = replace(state, boot=replace(boot, log_ended=True))
    if state.stage in SLEEP_STAGES:  # no health probes while asleep: ask the runtime whether it exited
        return state, (WaitExit(boot.workload_id or "", EXIT_WAIT_SECONDS, server=boot.server),)
    return watch(state, now)


def on_exited(state: MachineState, event: Exited, now: float) -> Step:
    boot = state.boot
    if boot is None:
        return state, ()
    if state.stage is Stage.ENDING and state.pending is not None:
        return decide_after(state, state.pending, exited_teardown(state, event.launcher_gone))
    served = state.stage in (Stage.READY, Stage.SNAPSHOTTING) or state.stage in SLEEP_STAGES
    facts = boot.facts
    if facts.failure is not None:
        cause = FailureCause.from_log(facts.failure)
    elif served:
        cause = FailureCause.ENGINE_DEAD
    elif event.exit_code == 2:
        cause = FailureCause.BAD_ARGUMENT
    else:
        cause = FailureCause.CRASH
    message = facts.failure_message or f"vLLM exited with code {event.exit_code}"
    if event.oom_killed:
        message += " (killed by the kernel's OOM killer: host RAM)"
    asleep = state.stage is Stage.ASLEEP
    failure = Failure(cause, message, facts, served, asleep=asleep)
    return decide_after(state, failure, exited_teardown(state, event.launcher_gone))


def on_still_running(state: MachineState, event: StillRunning, now: float) -> Step:
    boot = state.boot
    if boot is None:
        return state, ()
    wid = boot.workload_id or ""
    if state.stage is Stage.ENDING and state.pending is not None:
        return decide_after(state, state.pending, teardown(state))
    commands: list[Command] = []
    message = state.message
    if boot.outage is not None:
        commands.append(note("runtime_reconnected", container_id=wid, after_seconds=round(now - boot.outage.since, 1)))
        message = None
    boot = replace(boot, outage=None, log_ended=False)
    return replace(state, boot=boot, message=message), (*commands, FollowLogs(wid, resume=True, server=boot.server))


def on_health(state: MachineState, event: HealthChecked, now: float) -> Step:
    boot = state.boot
    if boot is None:
        return state, ()
    if state.stage is Stage.BOOTING:
        # Ready needs this boot's own evidence (its log's startup line) as well as /health: another
        # server left on the port would answer /health before this one has said anything.
        if not (event.status == 200 and boot.facts.ready) or boot.warm_up_since is not None:
            return state, ()
        # Up: the served shapes once before READY, so the first user request pays no kernel compile.
        timeout = max(1.0, min(WARM_UP_TIMEOUT_SECONDS, boot.deadline - now))
        boot = replace(boot, warm_up_since=now, phase=Phase.WARMING)
        return replace(state, boot=boot, wake_at=min(boot.deadline, now + MAX_IDLE_SECONDS)), (
            note("warming_up", timeout_seconds=round(timeout, 1)),
            WarmUp(timeout),
        )
    if event.status == 200 and event.sleeping:
        return _slept_unasked(state, now)
    if event.status == 200:
        return replace(state, boot=replace(boot, unhealthy=0)), ()
    unhealthy = boot.unhealthy + 1
    state = replace(state, boot=replace(boot, unhealthy=unhealthy))
    warn = note("health_failed", "warning", status=event.status, error=event.error, count=unhealthy)
    # 503 is vLLM's own "engine dead"; no answer twice in a row counts the same.
    if event.status == 503 or unhealthy >= 2:
        message = boot.facts.failure_message or f"health check failed ({event.status or event.error})"
        after, commands = decide_after(
            state, Failure(FailureCause.ENGINE_DEAD, message, boot.facts, served=True), teardown(state)
        )
        return after, (warn, *commands)
    return state, (warn,)


def on_warmed_up(state: MachineState, event: WarmedUp, now: float) -> Step:
    """The warm-up before READY came back: ready, with its seconds in the boot's timings; a warm-up that
    failed fails the boot (the log's failure class if it names one, else a hung engine), by the policy."""
    boot = state.boot
    if boot is None or state.stage is not Stage.BOOTING or boot.warm_up_since is None:
        return state, ()
    facts = boot.facts
    if event.error is not None:
        cause = FailureCause.from_log(facts.failure) if facts.failure is not None else FailureCause.ENGINE_HUNG
        message = f"the warm-up request before ready failed: {event.error}"
        warn = note("warm_up_failed", "warning", error=event.error, seconds=round(event.seconds, 3))
        after, commands = decide_after(state, Failure(cause, message, facts, served=False), teardown(state))
        return after, (warn, *commands)
    config = state.config
    kv_bytes = boot.learned_used if boot.learned_used is not None else facts.kv_cache_memory_bytes
    boot = replace(boot, ready_at=now, next_health=now + config.health_interval_seconds, phase=Phase.READY)
    boot = replace(boot, capture_due=wants_capture(boot))  # captured at the next look around (issue 41)
    # A learned boot whose KV cache is smaller than the profiled one's (vllm issue 57936) is said.
    shrunk = learning.kv_shrink_warning(boot.learned, facts.gpu_kv_cache_tokens) if boot.learned_used else None
    after = replace(
        state,
        stage=Stage.READY,
        boot=boot,
        message=shrunk or (None if boot.unanswered_warned else state.message),
        kv_cache_memory_bytes=kv_bytes,
        compile_cache_hit=facts.compile_cache_hit,
        compile_seconds=facts.compile_seconds,
        wake_at=now if boot.capture_due else min(boot.next_health, now + MAX_IDLE_SECONDS),
    )
    learn_baseline = boot.baseline if boot.learned_used is None else None
    if state.swap.since is not None:
        after = replace(after, swap=swap_done(state.swap, "wake", now))
    warned: tuple[Command, ...] = ()
    if shrunk is not None:
        warned += (note("kv_cache_smaller_than_profiled", "warning", message=shrunk),)
    if event.unwarmed is not None:
        warned += (note("warm_up_unwarmed", "warning", answer=event.unwarmed),)
    return after, (
        *warned,
        # Saved, then ready, then the GPUs free for the next boot: a neighbour starts only after this
        # boot is ready and on disk (all three run before status shows ready).
        RecordBoot(facts, kv_bytes, boot.learned_used is not None, boot.boot_key, learn_baseline),
        note(
            "ready",
            boot_seconds=round(now - boot.started_at, 3),
            warm_up_seconds=round(event.seconds, 3),
            kv_cache_memory_bytes=kv_bytes,
            learned_used=boot.learned_used is not None,
            compile_cache_hit=facts.compile_cache_hit,
        ),
        *woke_by_boot(state, now),
        ReleaseGpus(),
    )


SLEPT_UNASKED = "the server was put to sleep without dankserve asking (a POST /sleep on its loopback port): woken again"


def _slept_unasked(state: MachineState, now: float) -> Step:
    """A ready server that says it sleeps was slept by someone else: said, and woken (level unknown: the
    staged level-2 wake, which reloads the weights, serves both levels). Its GPU memory was never given
    to another member (the daemon held it awake), so the wake has room."""
    boot = state.boot
    assert boot is not None
    swap = replace(state.swap, level="2", since=now, wake_wanted=False)
    after = replace(state, stage=Stage.WAKING, swap=swap, wake_at=None, message=SLEPT_UNASKED)
    return after, (
        note("slept_unasked", "warning", message=SLEPT_UNASKED),
        note("waking", sleep_level="2"),
        WakeServer(boot.workload_id or "", "2"),
    )


def on_liveness(state: MachineState, event: LivenessFailed, now: float) -> Step:
    facts = state.facts
    return decide_after(state, Failure(event.cause, event.message, facts, served=True), teardown(state))


def on_member_lost(state: MachineState, event: MemberLost, now: float) -> Step:
    facts = state.facts
    served = state.stage is Stage.READY
    failure = Failure(FailureCause.ENGINE_DEAD, f"a member of the group was lost: {event.reason}", facts, served)
    return decide_after(state, failure, teardown(state))  # the group runtime logged group_member_lost


def on_unreachable(state: MachineState, event: RuntimeUnreachable, now: float) -> Step:
    boot = state.boot
    if state.stage in (Stage.BOOTING, Stage.READY) and boot is not None:
        # The runtime went away, not the deployment: keep probing the server, ask the runtime again later.
        commands: list[Command] = []
        message = state.message
        outage = boot.outage
        if outage is None:
            commands.append(note("runtime_unreachable", "warning", error=event.message, container_id=boot.workload_id))
            message = f"Podman unreachable since {event.clock_text}: {event.message}"
            outage = Outage(since=now, attempts=0, next_try=now)
        attempts = outage.attempts + 1
        retry = policy.restart_or_give_up(policy.Unavailable(attempts), now, state.config.restart)
        outage = replace(outage, attempts=attempts, next_try=now + retry.delay_seconds)
        return replace(state, boot=replace(boot, outage=outage), message=message), tuple(commands)
    return retry_later(state, event.message, now, cause="runtime_unreachable")


def on_refused(state: MachineState, event: Refused, now: float) -> Step:
    verdict = policy.restart_or_give_up(policy.Refusal(event.message), now, state.config.restart)
    after, commands = fail(state, verdict.reason, None)
    return after, (ReleaseGpus(), *commands)


def on_crashed(state: MachineState, event: Crashed, now: float) -> Step:
    facts = state.facts
    return decide_after(state, Failure(FailureCause.CRASH, event.message, facts, state.stage is Stage.READY), ())


def watch(state: MachineState, now: float) -> Step:
    """A running workload at `now`: the boot deadline, health checks due, a broken log stream."""
    boot = state.boot
    if boot is None or state.stage not in (Stage.BOOTING, Stage.READY):
        return state, ()
    config = state.config
    wid = boot.workload_id or ""
    if boot.log_ended and (boot.outage is None or now >= boot.outage.next_try):
        # The stream ended: the workload exited, or the runtime went away (or both).
        timeout = 1.0 if boot.outage is not None else EXIT_WAIT_SECONDS
        return replace(state, wake_at=now + MAX_IDLE_SECONDS), (WaitExit(wid, timeout, server=boot.server),)
    if state.stage is Stage.BOOTING:
        if now >= boot.deadline:
            message = f"not ready within {config.boot_timeout_seconds:.0f}s"
            warn = note("boot_timeout", "warning", seconds=config.boot_timeout_seconds)
            after, commands = decide_after(
                state, Failure(FailureCause.BOOT_TIMEOUT, message, boot.facts, False), teardown(state)
            )
            return after, (warn, *commands)
        wake = min(boot.deadline, now + MAX_IDLE_SECONDS)
        if boot.facts.ready and boot.warm_up_since is None:
            if (
                not boot.unanswered_warned
                and boot.up_logged_at is not None
                and now - boot.up_logged_at >= UNANSWERED_HEALTH_SECONDS
            ):
                message = UNANSWERED_HEALTH_MESSAGE.format(seconds=now - boot.up_logged_at)
                warn = note("health_unanswered", "warning", seconds=round(now - boot.up_logged_at, 1))
                state = replace(state, boot=replace(boot, unanswered_warned=True), message=message)
                boot = state.boot or boot
                if now < boot.next_health:
                    return replace(state, wake_at=min(wake, boot.next_health)), (warn,)
                boot = replace(boot, next_health=now + HEALTH_RETRY_SECONDS)
                return replace(state, boot=boot, wake_at=now + HEALTH_RETRY_SECONDS), (warn, ProbeHealth(1.0))
            if now >= boot.next_health:
                boot = replace(boot, next_health=now + HEALTH_RETRY_SECONDS)
                return replace(state, boot=boot, wake_at=now + HEALTH_RETRY_SECONDS), (ProbeHealth(1.0),)
            wake = min(wake, boot.next_health)
        return replace(state, wake_at=wake), ()
    if boot.capture_due and now >= boot.capture_after:
        return start_capture(state, now)
    if now >= boot.next_health:
        boot = replace(boot, next_health=now + config.health_interval_seconds)
        wake = min(boot.next_health, now + MAX_IDLE_SECONDS)
        if boot.capture_due:
            wake = min(wake, boot.capture_after)
        return replace(state, boot=boot, wake_at=wake), (ProbeHealth(min(2.0, config.health_interval_seconds)),)
    later = boot.capture_after if boot.capture_due else now + MAX_IDLE_SECONDS
    return replace(state, wake_at=min(boot.next_health, now + MAX_IDLE_SECONDS, later)), ()
