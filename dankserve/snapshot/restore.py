"""Restore: a snapshot's process tree back to serving.

The steps (sequence.restore_steps): `criu restore` (the tree comes back with its own host pids, its GPU
processes checkpointed, past its boot), GPU restore + unlock of the captured holders (by those pids, each
found in the restored tree), wake, the canary (its ids must be the captured
ones). A failed step kills what was restored and discards nothing on its own: the outcome's reason says
why, and the caller discards the snapshot and boots normally.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from dankserve.host.gpu_processes import process_tree
from dankserve.snapshot.gpu import GpuCheckpoint
from dankserve.snapshot.sequence import Step, on_failure, restore_steps
from dankserve.snapshot.steps import Hooks, Outcome, Runner, end_failed_restore, free_pids


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
    outcome: Outcome | None = None,
    after_criu: Callable[[int], None] = lambda pid: None,
    pids: Sequence[int] = (),
) -> Outcome:
    """Restores the tree in `images`; `holders` (the tree's GPU processes) and
    `expected_ids` are the capture's; `appended` the files it writes that grew since (its log: the process
    runtime's server log). `outcome`: one to continue (a capture's), else a new one. `after_criu(root pid)`:
    run as soon as CRIU made the tree, before anything else reaches it (a capture's look at its sockets).
    `pids`: the captured tree's host pids, waited for until free (a tree with host pids is restored with
    them; steps.free_pids)."""
    outcome = outcome if outcome is not None else Outcome("restore", None, holders=tuple(holders))
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
    made = Step("criu_restore")
    free_pids(pids)  # what is still taken then fails `criu restore` with CRIU's reason
    runner.run((made,))
    if not outcome.ok or outcome.pid is None:
        end_failed_restore(pids)
        return outcome
    after_criu(outcome.pid)
    tree = set(process_tree(outcome.pid))
    missing = [pid for pid in holders if pid not in tree]
    if missing:
        outcome.failure = on_failure("restore", (made,), Step("gpu_restore", missing[0]), "not in the restored tree")
        runner.undo(outcome.failure)
        return outcome
    outcome.holders = tuple(holders)
    return runner.run(restore_steps(holders)[1:], done_before=(made,))
