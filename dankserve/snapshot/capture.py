"""Capture: a warm server's process tree into a snapshot directory, the server left serving.

The steps (sequence.capture_steps): the reference canary, sleep, GPU lock + checkpoint of every
process of the tree holding a CUDA context, `criu dump --leave-running`, GPU restore + unlock, wake,
the canary (the same ids as the reference). A failed step is undone and the images discarded; the
outcome says why. Holding the gateway's requests and writing the store's manifest are the caller's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dankserve.host.gpu_processes import process_tree
from dankserve.snapshot.gpu import DEFAULT_LOCK_TIMEOUT_S, GpuCheckpoint
from dankserve.snapshot.sequence import capture_steps
from dankserve.snapshot.steps import Hooks, Outcome, Runner, clear_images


def capture(
    pid: int,
    images: Path,
    gpu: GpuCheckpoint,
    hooks: Hooks,
    *,
    criu_binary: str | None = None,
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    criu_options: Sequence[str] = (),
) -> Outcome:
    """Captures the tree rooted at `pid` into `images` (an existing, empty directory)."""
    holders = tuple(gpu.holders(process_tree(pid)))
    outcome = Outcome("capture", pid, holders=holders)
    runner = Runner(
        "capture",
        gpu,
        hooks,
        images,
        outcome,
        criu_binary=criu_binary,
        lock_timeout_s=lock_timeout_s,
        criu_options=tuple(criu_options),
    )
    runner.run(capture_steps(holders))
    if not outcome.ok:
        clear_images(images, keep=("dump.log",) if outcome.failure and outcome.failure.step.name == "criu_dump" else ())
    return outcome


def outage_seconds(outcome: Outcome) -> float:
    """How long the deployment's requests wait: the whole sequence, the two canaries included (the
    caller holds requests from before the reference canary until after the last one)."""
    return sum(outcome.timings.values())
