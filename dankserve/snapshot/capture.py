"""Capture: a warm server's process tree into a snapshot directory, then served again from it.

The steps (sequence.capture_steps): the reference canary, sleep, GPU lock + checkpoint of every
process of the tree holding a CUDA context, `criu dump` (the tree ends there), then the caller keeps the
files the image refers to by path (`after_dump(reference ids, holders)`: the /dev/shm
segments and CRIU's link-remap files, the manifest) and
the tree is restored at once from the image (restore.restore: `criu restore`, GPU restore + unlock,
wake, the canary must answer the reference ids). The restored tree is the server from then on.

A step failing before the tree ended is undone (the server serves) and the images discarded; once it
ended, a failure leaves no server (`Outcome.server_lost`): the caller boots one normally. Holding the
gateway's requests and writing the store's manifest are the caller's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

from dankserve.host.gpu_processes import process_tree
from dankserve.processes import gone_or_zombie
from dankserve.snapshot import tcp
from dankserve.snapshot.gpu import DEFAULT_LOCK_TIMEOUT_S, GpuCheckpoint
from dankserve.snapshot.restore import restore
from dankserve.snapshot.sequence import Failure, Step, capture_steps
from dankserve.snapshot.steps import Hooks, Outcome, Runner, clear_images


def capture(
    pid: int,
    images: Path,
    gpu: GpuCheckpoint,
    hooks: Hooks,
    *,
    after_dump: Callable[[tuple[int, ...], tuple[int, ...]], None] = lambda ids, holders: None,
    criu_binary: str | None = None,
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    criu_options: Sequence[str] = (),
    appended: Sequence[Path] = (),
    max_bytes: int | None = None,
) -> Outcome:
    """Captures the tree rooted at `pid` into `images` (an existing, empty directory) and restores it: on
    success `Outcome.pid` is the restored tree's root and `holders` its GPU processes, by the host pids the
    tree keeps (docs/snapshots.md, "Host pids"). `max_bytes`: the disk budget an image must fit (room.py)."""
    tree = tuple(process_tree(pid))
    holders = tuple(gpu.holders(list(tree)))
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
        room_budget_bytes=max_bytes,
    )
    runner.run(capture_steps(holders))
    if not outcome.ok:
        outcome.server_lost = gone_or_zombie(pid)  # a failed dump leaves the root running; a finished one ends it
        clear_images(images, keep=("dump.log",) if outcome.failure and outcome.failure.step.name == "criu_dump" else ())
        return outcome
    expected = runner.expected_ids
    try:
        after_dump(expected, holders)
    except (OSError, ValueError) as exc:
        outcome.failure = Failure("capture", Step("keep_files"), str(exc) or type(exc).__name__, ())
    leaked: list[tcp.Connection] = []  # the image's own client connections, read before any new one comes
    if outcome.ok:  # the snapshot proves itself: served again from the image
        outcome.pid = None
        restore(
            images,
            gpu,
            hooks,
            holders=holders,
            expected_ids=expected,
            criu_binary=criu_binary,
            appended=appended,
            criu_options=criu_options,
            outcome=outcome,
            after_criu=lambda root: leaked.extend(tcp.read_outside(root)),
            pids=tree,  # host pids (docs/snapshots.md, "Host pids"): the dumped tree's, freed first
        )
        outcome.holders = holders
    if outcome.failure is not None:
        outcome.failure = dataclasses.replace(outcome.failure, kind="capture")
        outcome.server_lost = True
        clear_images(images, keep=("restore.log",))
    elif outcome.pid is not None and leaked:
        # A client connected between the quiet step and CRIU's freeze: the image holds its connection, so
        # it is not kept (tcp.py); the restored tree serves on (`Outcome.pid`, not lost). Read as soon as
        # CRIU made the tree: the wake's and the canary's own connections come after.
        why = f"a client connected during the dump: {tcp.describe(leaked)}"
        outcome.failure = Failure("capture", Step("quiet"), why, ())
        clear_images(images)
    return outcome


def outage_seconds(outcome: Outcome) -> float:
    """How long the deployment's requests wait: the whole sequence, the dump and the restore, the two
    canaries included (the caller holds requests from before the reference canary until after the last)."""
    return sum(outcome.timings.values())
