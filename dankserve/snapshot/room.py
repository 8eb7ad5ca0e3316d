"""Whether a capture's image fits, asked after the GPU checkpoint and before `criu dump` writes a byte.

Found on an H100 with real vLLM: a server captured without sleep mode had its whole GPU memory (16 GB of
weights and 58 GB of KV cache) moved into host memory by the checkpoint, and CRIU wrote until the disk was
full (82 s, "No space left on device") before the capture failed. A full disk harms everything else on the
host, so the image's size is estimated first: the tree's anonymous and shared memory once the checkpoint
has moved the GPU's into it (what CRIU dumps; file-backed pages it does not), against the disk budget and
the free space of the store's filesystem less a margin. Too big: the capture fails at this step, before
the dump, and is undone (the server serves on).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

GIB = 2**30
MARGIN_BYTES = 2 * GIB
"""Left free on the store's filesystem after the image (journald, the daemon's state, the server's logs)."""
MARGIN_FRACTION = 0.05
_STATUS_FIELDS = (b"RssAnon:", b"RssShmem:")


def tree_image_bytes(pids: Iterable[int], proc: Path = Path("/proc")) -> int:
    """About what `criu dump` writes for these processes: their resident anonymous and shared memory."""
    total = 0
    for pid in pids:
        try:
            status = (proc / str(pid) / "status").read_bytes()[:65536]
        except OSError:  # gone: nothing of it is dumped
            continue
        for line in status.splitlines():
            if line.startswith(_STATUS_FIELDS):
                parts = line.split()
                if len(parts) >= 2 and parts[1].isdigit():
                    total += int(parts[1]) * 1024  # kB
    return total


def space(path: Path) -> tuple[int, int]:
    """(bytes an unprivileged writer may still put on `path`'s filesystem, the filesystem's size)."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def problem(pids: Iterable[int], images: Path, budget: int | None) -> str | None:
    """Why the image of these processes may not be written into `images` (None: it fits)."""
    free, size = space(images)
    return shortfall(tree_image_bytes(pids), free, size, budget)


def shortfall(image: int, free: int, filesystem: int, budget: int | None) -> str | None:
    """Why an image of `image` bytes may not be written (None: it fits). Pure."""
    margin = max(MARGIN_BYTES, int(filesystem * MARGIN_FRACTION))
    about = f"the image would take about {_gib(image)} (the server's memory once its GPU memory is checkpointed)"
    if budget is not None and image > budget:
        return f"{about}, over snapshot_max_bytes ({_gib(budget)}); nothing was written"
    if image > free - margin:
        return (
            f"{about}, but the snapshot store's filesystem has {_gib(free)} free and {_gib(margin)} stay free; "
            "nothing was written"
        )
    return None


def _gib(value: int) -> str:
    return f"{value / GIB:.1f} GiB"
