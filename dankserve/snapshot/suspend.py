"""Suspend and resume of a sleeping server's CUDA processes (issue 41 item 7, zero-residual sleep).

A swap group member asleep at level 1 still holds its CUDA context, graphs and pools on the GPU (1.1 to 1.4 GiB
measured on the H200). Suspended, each of its processes holding a CUDA context is GPU-locked and then
checkpointed (`cuCheckpointProcessLock/Checkpoint`): that memory moves to host memory and the GPU holds 0
bytes of it. The wake restores and unlocks them (`cuCheckpointProcessRestore/Unlock`) before the server's
own wake. No CRIU: the processes keep running, only their GPU state leaves.

The steps follow each process's state as the driver reports it, so both are safe to run again (a daemon
killed with -9 midway, or a member adopted suspended): a process already locked is not locked again, one
already checkpointed is left so. Every process is locked before any is checkpointed, and restored before
any is unlocked (as the capture does). A failed suspend is undone as a capture is: each checkpointed
process restored, each locked one unlocked, so the server sleeps at plain level 1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from dankserve.snapshot.gpu import DEFAULT_LOCK_TIMEOUT_S, GpuCheckpoint, GpuCheckpointError, ProcessState
from dankserve.snapshot.sequence import Failure, Kind, Step, StepName
from dankserve.snapshot.steps import Hooks, Outcome, Runner

_SETTLED: frozenset[ProcessState] = frozenset({"running", "locked", "checkpointed"})


def suspend_steps(states: Mapping[int, ProcessState]) -> tuple[Step, ...]:
    """Lock whatever runs, then checkpoint whatever is not checkpointed yet (pure)."""
    return (
        *(Step("gpu_lock", pid) for pid, state in states.items() if state == "running"),
        *(Step("gpu_checkpoint", pid) for pid, state in states.items() if state in ("running", "locked")),
    )


def resume_steps(states: Mapping[int, ProcessState]) -> tuple[Step, ...]:
    """Restore whatever is checkpointed, then unlock whatever is not running yet (pure)."""
    return (
        *(Step("gpu_restore", pid) for pid, state in states.items() if state == "checkpointed"),
        *(Step("gpu_unlock", pid) for pid, state in states.items() if state in ("checkpointed", "locked")),
    )


def suspend(holders: Sequence[int], gpu: GpuCheckpoint, lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> Outcome:
    """The holders' GPU memory off the GPU; on failure undone (restored, unlocked) with the reason."""
    if not holders:
        outcome = Outcome("suspend", None)
        outcome.failure = Failure("suspend", Step("gpu_lock"), NO_HOLDERS, ())
        outcome.remedy = "deployment"
        return outcome
    return _run("suspend", holders, gpu, suspend_steps, lock_timeout_s)


def resume(holders: Sequence[int], gpu: GpuCheckpoint) -> Outcome:
    """The holders' GPU memory back and their CUDA calls released (nothing to do for a process running)."""
    return _run("resume", holders, gpu, resume_steps, DEFAULT_LOCK_TIMEOUT_S)


NO_HOLDERS = "no process of the server holds a CUDA context (nothing to checkpoint)"


def _run(
    kind: Kind,
    holders: Sequence[int],
    gpu: GpuCheckpoint,
    steps_of: Callable[[Mapping[int, ProcessState]], tuple[Step, ...]],
    lock_timeout_s: float,
) -> Outcome:
    outcome = Outcome(kind, holders[0] if holders else None, holders=tuple(holders))
    first: StepName = "gpu_lock" if kind == "suspend" else "gpu_restore"
    states: dict[int, ProcessState] = {}
    try:
        for pid in holders:
            states[pid] = gpu.state(pid)
            if states[pid] not in _SETTLED:
                raise GpuCheckpointError(
                    "state", pid, f"the process is {states[pid]}, not running, locked or checkpointed"
                )
    except GpuCheckpointError as exc:
        outcome.failure = Failure(kind, Step(first, exc.pid), exc.message, ())
        outcome.remedy = exc.remedy
        return outcome
    runner = Runner(kind, gpu, _NO_HOOKS, Path(), outcome, lock_timeout_s=lock_timeout_s)
    return runner.run(steps_of(states))


def _no_route() -> None:
    raise AssertionError("a GPU suspend or resume runs no server route")


_NO_HOOKS = Hooks(sleep=_no_route, wake=_no_route, canary=lambda: ())
