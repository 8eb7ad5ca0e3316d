"""The snapshot of the image before an upgrade, kept for the upgrade's rollback (issue 41, docs/snapshots.md).

When a switched upgrade's new image plans the deployment, its snapshot (of the old image) is invalid for the new
plan, yet the upgrade record can still roll back to it: it is moved aside as `NAME@previous` (counted in
`snapshot_max_bytes`, listed by `dankserve snapshot list`, deleted by `snapshot rm`) instead of deleted. A
plan it is valid for (`dankserve rollback`, or a configuration naming the old image again) takes it back as
NAME: the boot restores it. Once no switched upgrade can roll back to it (rolled back, superseded by a later
upgrade, which sets the snapshot of its own old image aside in its place) and it is invalid, it is deleted.

`keep_aside` and `take_back` decide from what the caller hands in (the entry's validity for the plan, whether
a switched upgrade can roll back) and do the moves in the store; the reasons are returned for the verdict.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dankserve.errors import DankserveError
from dankserve.snapshot import store

Judge = Callable[[Path], str | None]
"""Why the entry at a path is invalid for the plan being booted (None: valid)."""


def take_back(root: Path, name: str, judge: Judge, *, switched: bool, log: Any) -> bool:
    """The entry kept aside becomes NAME again when it is valid for this plan (the one at NAME, invalid or
    absent, is deleted); one that is not, and that no switched upgrade can roll back to, is deleted. Whether
    it was taken back."""
    kept = store.previous(name)
    if not (root / kept).exists() and not (root / kept).is_symlink():
        return False
    entry = store.read_entry(root, kept)
    why = judge(entry.path) if entry.state == "ready" else (entry.reason or entry.state)
    try:
        if why is None:
            store.move(root, kept, name)
            log.info("snapshot_taken_back", kept=kept, reason="valid for this plan: the boot restores it")
            return True
        if not switched or entry.state != "ready":
            store.remove(root, kept)
            log.info("snapshot_discarded", snapshot=kept, reason=f"no upgrade rolls back to it: {why}")
    except (DankserveError, OSError) as exc:
        log.warning("snapshot_discarded", snapshot=kept, reason=str(getattr(exc, "message", exc)))
        with contextlib.suppress(DankserveError, OSError):
            store.remove(root, kept)
    return False


def keep_aside(root: Path, name: str, why: str, *, switched: bool, other_image: bool, log: Any) -> bool:
    """NAME, invalid for this plan because a switched upgrade runs another image, moved aside for the
    rollback (replacing what an earlier upgrade kept); whether it was."""
    if not (switched and other_image):
        return False
    try:
        store.move(root, name, store.previous(name))
    except (DankserveError, OSError):
        return False
    log.info("snapshot_kept_for_rollback", kept=store.previous(name), reason=why)
    return True
