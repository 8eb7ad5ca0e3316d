"""What several handlers end with: a new boot, a teardown, a failure to decide, giving up, retrying later."""

from __future__ import annotations

from dataclasses import replace

from dankserve.supervisor import policy
from dankserve.supervisor.machine.commands import (
    Command,
    CountGpuTenants,
    EnsureImage,
    EnsureWeights,
    RecordFailure,
    RecordRestart,
    ReleaseGpus,
    RemoveWorkload,
    StopServer,
    StopWorkload,
    note,
)
from dankserve.supervisor.machine.stages import (
    RUNNING,
    SLEEP_STAGES,
    Stage,
)
from dankserve.supervisor.machine.state import (
    Boot,
    Failure,
    LastFailure,
    MachineState,
)

Step = tuple[MachineState, tuple[Command, ...]]
"""What `step` returns: the state after an event, and the commands to run (in order)."""


def begin_boot(state: MachineState, now: float) -> Step:
    boot = Boot(started_at=now)
    base = replace(state, boot=boot, pending=None, message=None, wake_at=None, port_holder=None)
    if state.config.download_weights:
        return replace(base, stage=Stage.DOWNLOADING), (EnsureWeights(),)
    return replace(base, stage=Stage.PULLING), (EnsureImage(),)


def teardown(state: MachineState, *, keep_launcher: bool = True) -> tuple[Command, ...]:
    """Stop and remove the running workload (if any) and give the GPUs back.

    A launcher's server is stopped and its launcher kept for the next boot (unless `keep_launcher`
    is False: SIGTERM, or the deployment removed)."""
    wid = state.workload_id
    out: list[Command] = []
    if wid is not None and (state.stage in RUNNING or state.stage in SLEEP_STAGES):
        server = state.boot.server if state.boot is not None else None
        if server is not None and keep_launcher:
            out.append(StopServer(wid, server))
        else:
            out += [StopWorkload(wid), RemoveWorkload(wid)]
    out.append(ReleaseGpus())
    return tuple(out)


def exited_teardown(state: MachineState, launcher_gone: bool) -> tuple[Command, ...]:
    """After the server exited: remove its workload, unless it was a launcher's server and the launcher lives."""
    boot = state.boot
    wid = state.workload_id or ""
    if boot is not None and boot.server is not None and not launcher_gone:
        return ()
    return (RemoveWorkload(wid, best_effort=True),)


def decide_after(state: MachineState, failure: Failure, teardown: tuple[Command, ...]) -> Step:
    """The workload is being removed (`teardown`); then ask NVML about the GPUs and decide."""
    uuids = state.boot.uuids if state.boot is not None else state.gpu_uuids
    commands = tuple(c for c in teardown if not isinstance(c, ReleaseGpus))
    after = replace(state, stage=Stage.DECIDING, pending=failure, wake_at=None)
    return after, (*commands, ReleaseGpus(), CountGpuTenants(uuids))


def fail(state: MachineState, message: str, cause: str | None) -> Step:
    after = replace(state, stage=Stage.FAILED, message=message, wake_at=None, pending=None)
    return after, (note("deployment_failed", "error", failure=cause, failure_message=message),)


def retry_later(state: MachineState, why: str, now: float, cause: str = "retry") -> Step:
    """Something the boot needs did not answer: wait (`policy.restart_or_give_up`'s retry), no failure counted.

    Unless a failure was being decided when it stopped answering (a server that died during a Podman outage:
    its teardown found Podman away): that failure happened, and the boot after the wait restarts after it, so
    both are recorded (`last_failure`, `restarts`) as the decision would have."""
    attempts = state.retry_attempts + 1
    delay = policy.restart_or_give_up(policy.Unavailable(attempts), now, state.config.restart).delay_seconds
    traced: tuple[Command, ...] = ()
    failure = state.pending
    if failure is not None:
        state = replace(
            state,
            failures=(*state.failures, now),
            restarts=state.restarts + 1,
            last_failure=LastFailure(failure.cause.value, failure.message, now),
        )
        traced = (
            RecordFailure(failure.cause.value, failure.message),
            note("boot_failed", "warning", failure=failure.cause.value, action="restart", decision=why),
            RecordRestart(),
        )
    after = replace(
        state,
        stage=Stage.RETRY_WAIT,
        retry_attempts=attempts,
        wake_at=now + delay,
        pending=None,
        port_holder=None,
        message=f"{why}; retrying in {delay:.1f} s",
    )
    # A running workload is left alone: the next boot adopts it if it kept running, else replaces it.
    return after, (*traced, ReleaseGpus(), note(cause, "warning", error=why, retry_in_seconds=round(delay, 2)))
