"""The capture and restore sequences as data (pure): their ordered steps, and what a failed step means.

Capture (issue 41, docs/snapshots.md): the reference canary (the greedy ids the snapshot will be
judged by), sleep, GPU lock then checkpoint of every process holding a CUDA context, quiet (no
client's connection left open in the tree: tcp.py), `criu dump` (the tree ends there: CRIU's link-remap
files of a `--leave-running` dump are deleted after it, so no later restore of such an image works on
real vLLM), then at once the restore's steps from the image: the
snapshot proves itself and the restored tree serves. Restore: `criu restore`, GPU restore then unlock,
wake, the canary (its ids must be the captured ones).

A capture that fails before the tree ended leaves the server serving: the steps done are undone in
reverse (a checkpointed process restored, a locked one unlocked, a slept server woken) and the
half-written snapshot is discarded with the reason. Once the dump ended the tree, a failure (of the
restore) loses the server: the caller boots it normally. A restore that fails kills what it restored
and discards the snapshot; the caller then boots normally.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

StepName = Literal[
    "reference",
    "sleep",
    "room",
    "quiet",
    "gpu_lock",
    "gpu_checkpoint",
    "criu_dump",
    "criu_restore",
    "gpu_restore",
    "gpu_unlock",
    "wake",
    "canary",
    "kill_tree",
    "keep_files",
]
Kind = Literal["capture", "restore", "suspend", "resume"]
"""suspend and resume: a sleeping swap member's CUDA processes (snapshot/suspend.py); undone as a capture."""

# The breakdown a restore reports (issue 44: CRIU restore, GPU restore, wake, canary).
RESTORE_TIMINGS: tuple[StepName, ...] = ("criu_restore", "gpu_restore", "gpu_unlock", "wake", "canary")


@dataclass(frozen=True, slots=True)
class Step:
    name: StepName
    pid: int | None = None
    """The process a GPU step acts on; None for the steps on the whole server."""


def capture_steps(holders: Sequence[int]) -> tuple[Step, ...]:
    """Up to the dump, which ends the tree (the restore's steps follow: `restore_steps`). Every process is
    locked before any is checkpointed (the engine's processes stop together)."""
    return (
        Step("reference"),
        Step("sleep"),
        *(Step("gpu_lock", pid) for pid in holders),
        *(Step("gpu_checkpoint", pid) for pid in holders),
        Step("room"),  # the image's size known (the GPU's memory now in the tree's), before CRIU writes it
        Step("quiet"),  # no client's connection left in the tree, checked as late as can be (snapshot/tcp.py)
        Step("criu_dump"),
    )


def restore_steps(holders: Sequence[int]) -> tuple[Step, ...]:
    """`holders`: the restored tree's GPU processes by their host pids (CRIU restores each process with the
    pid it had: docs/snapshots.md, "Host pids")."""
    return (
        Step("criu_restore"),
        *(Step("gpu_restore", pid) for pid in holders),
        *(Step("gpu_unlock", pid) for pid in holders),
        Step("wake"),
        Step("canary"),
    )


@dataclass(frozen=True, slots=True)
class Failure:
    """What a failed step means: the steps that put things back, and the reason the snapshot is discarded."""

    kind: Kind
    step: Step
    reason: str
    undo: tuple[Step, ...]

    @property
    def message(self) -> str:
        where = f" (pid {self.step.pid})" if self.step.pid is not None else ""
        return f"{self.kind} failed at {self.step.name}{where}: {self.reason}"


def _capture_undo(done: Sequence[Step]) -> tuple[Step, ...]:
    """What brings a half-captured server back to serving, in order: GPU restores, unlocks, the wake."""
    names = [(s.name, s.pid) for s in done]
    checkpointed = [s.pid for s in done if s.name == "gpu_checkpoint" and ("gpu_restore", s.pid) not in names]
    locked = [s.pid for s in done if s.name == "gpu_lock" and ("gpu_unlock", s.pid) not in names]
    slept = ("sleep", None) in names and ("wake", None) not in names
    return (
        *(Step("gpu_restore", pid) for pid in checkpointed),
        *(Step("gpu_unlock", pid) for pid in locked),
        *((Step("wake"),) if slept else ()),
    )


def on_failure(kind: Kind, done: Sequence[Step], failed: Step, reason: str) -> Failure:
    """The failure of `failed` after `done` succeeded. A restore's tree is killed once CRIU made it;
    a capture is undone (the driver leaves a process whose lock failed running, and one whose
    checkpoint failed locked: the failed step itself needs no undo)."""
    if kind == "restore":
        made = any(s.name == "criu_restore" for s in done)
        return Failure(kind, failed, reason, (Step("kill_tree"),) if made else ())
    return Failure(kind, failed, reason, _capture_undo(done))


def canary_problem(expected: Sequence[int], got: Sequence[int]) -> str | None:
    """None when the canary returned the captured greedy ids; else what differs (ids are not secret)."""
    if tuple(expected) == tuple(got):
        return None
    pairs = enumerate(zip(expected, got, strict=False))
    first = next((i for i, (a, b) in pairs if a != b), min(len(expected), len(got)))
    return f"greedy ids differ from the captured ones at token {first} (expected {len(expected)} ids, got {len(got)})"
