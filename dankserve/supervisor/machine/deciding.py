"""The handler that decides after a failure, once NVML said who else holds the GPUs: restart, remediate,
or give up, as `policy.restart_or_give_up` says."""

from __future__ import annotations

from dataclasses import replace

from dankserve.supervisor import policy
from dankserve.supervisor.machine.booting import kv_decision
from dankserve.supervisor.machine.commands import (
    Command,
    ForgetLearned,
    RecordFailure,
    RecordRestart,
    SetRemediation,
    note,
)
from dankserve.supervisor.machine.events import (
    GpuTenants,
)
from dankserve.supervisor.machine.outcomes import (
    Step,
    fail,
)
from dankserve.supervisor.machine.stages import (
    Stage,
)
from dankserve.supervisor.machine.state import (
    Boot,
    LastFailure,
    MachineState,
)
from dankserve.supervisor.policy import FailureContext


def _others_crowd(boot: Boot | None, event: GpuTenants) -> bool:
    """Whether other processes on the GPUs may be what ran out of memory.

    Unknown is not "none": an OOM with unknown tenants waits, it does not drop the learned bytes. But when
    the learned bytes were in use and the GPUs' free memory now (ours stopped) still passes their guard,
    the others hold no more than when the bytes were learned (a sleeping swap member's CUDA context, seen
    on the H200): they are not what changed, the learned bytes are suspect."""
    if event.other_processes is False:
        return False
    if boot is None or boot.learned is None or boot.learned_used is None or not event.free:
        return True
    return kv_decision(boot.learned, event.free).use_bytes is None


def on_gpu_tenants(state: MachineState, event: GpuTenants, now: float) -> Step:
    failure = state.pending
    if failure is None:
        return state, ()
    boot = state.boot
    config = state.config
    relearned = False if failure.served else state.relearned
    facts = failure.facts
    context = FailureContext(
        message=failure.message,
        max_model_len_setting=config.max_model_len_setting,
        estimated_max_model_len=facts.estimated_max_model_len if facts else None,
        gpu_memory_utilization_setting=config.gpu_memory_utilization_setting,
        gpu_memory_utilization_planned=boot.planned_utilization if boot else None,
        utilization_band_top=boot.band_top if boot else None,
        remediated=state.remediated,
        learned_kv_in_use=boot is not None and boot.learned_used is not None,
        relearned=relearned,
        other_gpu_processes=_others_crowd(boot, event),
    )
    failures = (*state.failures, now)
    draw = event.draw
    verdict = policy.restart_or_give_up(
        policy.BootFailed(failure.cause, context, failures), now, config.restart, lambda a, b: a + (b - a) * draw
    )
    decision = verdict.decision
    assert decision is not None  # a boot failure always has its row of the table
    state = replace(
        state,
        failures=failures,
        relearned=relearned,
        pending=None,
        last_failure=LastFailure(failure.cause.value, failure.message, now),
    )
    commands: list[Command] = [
        RecordFailure(failure.cause.value, failure.message),
        note(
            "boot_failed",
            "warning",
            failure=failure.cause.value,
            action=decision.action.value,
            decision=decision.reason,
        ),
    ]
    if verdict.kind == "give_up" and verdict.restart is None:  # the table's verdict: a configuration error
        after, more = fail(state, verdict.reason, failure.cause.value)
        return after, (*commands, *more)
    if decision.overrides:
        remediated = state.remediated
        if decision.remediation is not None:
            remediated = remediated | {decision.remediation}
        state = replace(state, overrides=state.overrides.with_remediation(decision.overrides), remediated=remediated)
        commands.append(SetRemediation(dict(decision.overrides), tuple(sorted(c.value for c in remediated))))
    if decision.drop_learned_kv and boot is not None and boot.boot_key is not None:
        commands.append(ForgetLearned(boot.boot_key))
        state = replace(state, relearned=True)
    if verdict.kind == "give_up":  # the restart window's verdict: too many failures
        after, more = fail(state, verdict.reason, failure.cause.value)
        return after, (*commands, *more)
    if failure.asleep:
        swap = replace(state.swap, level="stop", since=None, wake_wanted=False)
        after = replace(state, stage=Stage.ASLEEP, boot=None, swap=swap, wake_at=None)
        return after, (*commands, note("asleep_until_woken", reason="its server died while asleep"))
    state = replace(
        state, stage=Stage.BACKOFF, restarts=state.restarts + 1, wake_at=now + verdict.delay_seconds, retry_attempts=0
    )
    return state, (
        *commands,
        RecordRestart(),
        note("restart_scheduled", delay_seconds=round(verdict.delay_seconds, 2), reason=verdict.reason),
    )
