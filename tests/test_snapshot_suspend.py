"""Tests for dankserve.snapshot.suspend: a sleeping server's CUDA processes suspended (locked, checkpointed) and
resumed (restored, unlocked) by their states, every lock before any checkpoint and every restore before any
unlock; a failure undone with its reason and the driver's remedy. The GPU checkpoint edge is an in-memory one
with the driver's state machine (the real edges are tested in test_snapshot_gpu.py and through the daemon)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dankserve.snapshot import suspend
from dankserve.snapshot.gpu import (
    CUDA_ERROR_NOT_SUPPORTED,
    CUDA_ERROR_OUT_OF_MEMORY,
    DEFAULT_LOCK_TIMEOUT_S,
    ProcessState,
    error_for,
)

_MOVES: dict[str, tuple[ProcessState, ProcessState]] = {
    "lock": ("running", "locked"),
    "checkpoint": ("locked", "checkpointed"),
    "restore": ("checkpointed", "locked"),
    "unlock": ("locked", "running"),
}


@dataclass
class Gpu:
    """The driver's process states; `fail`: (action, pid) -> the CUresult it answers."""

    states: dict[int, ProcessState]
    fail: dict[tuple[str, int], int] = field(default_factory=dict)
    calls: list[tuple[str, int]] = field(default_factory=list)

    def holders(self, pids: list[int]) -> list[int]:
        return [p for p in pids if p in self.states]

    def _act(self, action: str, pid: int) -> None:
        self.calls.append((action, pid))
        code = self.fail.get((action, pid))
        if code is not None:
            raise error_for(action, pid, code)
        before, after = _MOVES[action]
        if self.states[pid] != before:
            raise error_for(action, pid, 401)
        self.states[pid] = after

    def lock(self, pid: int, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> None:
        self._act("lock", pid)

    def checkpoint(self, pid: int) -> None:
        self._act("checkpoint", pid)

    def restore(self, pid: int) -> None:
        self._act("restore", pid)

    def unlock(self, pid: int) -> None:
        self._act("unlock", pid)

    def state(self, pid: int) -> ProcessState:
        return self.states[pid]

    def restore_thread_id(self, pid: int) -> int:
        return pid


def test_suspend_locks_every_process_before_checkpointing_any_and_resume_restores_all_before_unlocking() -> None:
    gpu = Gpu({7: "running", 8: "running"})
    done = suspend.suspend([7, 8], gpu)
    assert done.ok and gpu.states == {7: "checkpointed", 8: "checkpointed"}
    assert gpu.calls == [("lock", 7), ("lock", 8), ("checkpoint", 7), ("checkpoint", 8)]
    gpu.calls.clear()
    back = suspend.resume([7, 8], gpu)
    assert back.ok and gpu.states == {7: "running", 8: "running"}
    assert gpu.calls == [("restore", 7), ("restore", 8), ("unlock", 7), ("unlock", 8)]
    assert set(back.timings) == {"gpu_restore", "gpu_unlock"}


def test_the_steps_follow_each_process_state_so_both_are_safe_to_run_again() -> None:
    """A daemon killed midway leaves processes locked or checkpointed: nothing is done twice."""
    assert [(s.name, s.pid) for s in suspend.suspend_steps({1: "running", 2: "locked", 3: "checkpointed"})] == [
        ("gpu_lock", 1),
        ("gpu_checkpoint", 1),
        ("gpu_checkpoint", 2),
    ]
    assert [(s.name, s.pid) for s in suspend.resume_steps({1: "running", 2: "locked", 3: "checkpointed"})] == [
        ("gpu_restore", 3),
        ("gpu_unlock", 2),
        ("gpu_unlock", 3),
    ]
    gpu = Gpu({7: "running"})
    assert suspend.resume([7], gpu).ok and gpu.calls == []  # running already: nothing to resume


def test_a_failed_checkpoint_is_undone_the_server_runs_unlocked_and_the_remedy_is_kept() -> None:
    gpu = Gpu({7: "running", 8: "running"}, fail={("checkpoint", 8): CUDA_ERROR_NOT_SUPPORTED})
    done = suspend.suspend([7, 8], gpu)
    assert not done.ok and done.remedy == "deployment"
    assert done.reason is not None and done.reason.startswith("suspend failed at gpu_checkpoint (pid 8)")
    assert "CUDA_ERROR_NOT_SUPPORTED" in done.reason
    assert gpu.states == {7: "running", 8: "running"}, "7 restored and unlocked, 8 unlocked"


def test_a_failed_gpu_restore_says_why_with_the_undo_remedy() -> None:
    gpu = Gpu({7: "checkpointed"}, fail={("restore", 7): CUDA_ERROR_OUT_OF_MEMORY})
    done = suspend.resume([7], gpu)
    assert not done.ok and done.remedy == "undo"
    assert done.reason is not None and "resume failed at gpu_restore (pid 7)" in done.reason
    assert "CUDA_ERROR_OUT_OF_MEMORY" in done.reason


def test_no_cuda_process_or_one_in_an_odd_state_fails_before_anything_is_done() -> None:
    nothing = suspend.suspend([], Gpu({}))
    assert not nothing.ok and nothing.reason is not None and suspend.NO_HOLDERS in nothing.reason
    assert nothing.remedy == "deployment"
    gpu = Gpu({7: "failed"})
    odd = suspend.suspend([7], gpu)
    assert not odd.ok and odd.reason is not None and "the process is failed" in odd.reason and gpu.calls == []
