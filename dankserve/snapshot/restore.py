"""Restore: a snapshot's process tree back to serving.

The steps (sequence.restore_steps): `criu restore` (the tree comes back with its pids, its GPU
processes checkpointed, past its boot), GPU restore + unlock of the captured holders, wake, the canary
(its ids must be the captured ones). A failed step kills what was restored and discards nothing on
its own: the outcome's reason says why, and the caller discards the snapshot and boots normally.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dankserve.snapshot.gpu import GpuCheckpoint
from dankserve.snapshot.sequence import restore_steps
from dankserve.snapshot.steps import Hooks, Outcome, Runner


def restore(
    images: Path,
    gpu: GpuCheckpoint,
    hooks: Hooks,
    *,
    holders: Sequence[int],
    expected_ids: Sequence[int],
    criu_binary: str | None = None,
    appended: Sequence[Path] = (),
    criu_options: Sequence[str] = (),
) -> Outcome:
    """Restores the tree in `images`; `holders` and `expected_ids` are the capture's; `appended` the files
    it writes that grew since (its log: the process runtime's server log)."""
    outcome = Outcome("restore", None, holders=tuple(holders))
    runner = Runner(
        "restore",
        gpu,
        hooks,
        images,
        outcome,
        expected_ids=tuple(expected_ids),
        criu_binary=criu_binary,
        appended=tuple(appended),
        criu_options=tuple(criu_options),
    )
    return runner.run(restore_steps(holders))
