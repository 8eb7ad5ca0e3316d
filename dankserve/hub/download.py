"""Pure decisions of a pull: which files, whether they fit on disk, how far along it is.

vLLM loads safetensors when a repo has them, so the other weight formats (PyTorch .bin,
Flax, TF, ONNX, GGUF, `original/` checkpoints) are left out then, as vLLM's own download does.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

GIB = 1 << 30
MIB = 1 << 20

OTHER_WEIGHT_FORMATS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.h5", "*.msgpack", "*.onnx", "*.ot", "*.gguf", "*.tflite")
OTHER_CHECKPOINT_DIRS = ("original/", "consolidated/")
DISK_MARGIN_BYTES = GIB
"""Left free after a pull: a full file system breaks the daemon's state writes and the logs."""


@dataclass(frozen=True)
class RemoteFile:
    """One file of a repo at a commit, as the Hub lists it."""

    path: str
    size: int
    sha256: str | None = None
    """What the Hub's listing gives for an LFS file: the bytes must hash to it."""


def choose_files(files: Iterable[RemoteFile]) -> tuple[RemoteFile, ...]:
    """The files vLLM needs: everything, minus other weight formats when safetensors exist."""
    listed = tuple(files)
    if not any(f.path.endswith(".safetensors") for f in listed):
        return listed
    return tuple(
        f
        for f in listed
        if not any(fnmatch.fnmatch(f.path, pattern) for pattern in OTHER_WEIGHT_FORMATS)
        and not f.path.startswith(OTHER_CHECKPOINT_DIRS)
    )


@dataclass(frozen=True)
class PullPlan:
    """What a pull must fetch and what it may skip."""

    wanted: tuple[RemoteFile, ...]
    missing: tuple[RemoteFile, ...]
    partial_bytes: int
    """Bytes already in `.incomplete` files: a resumed download does not fetch them again."""

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.wanted)

    @property
    def complete_bytes(self) -> int:
        return self.total_bytes - sum(f.size for f in self.missing)

    @property
    def bytes_to_fetch(self) -> int:
        return max(0, sum(f.size for f in self.missing) - self.partial_bytes)


def plan_pull(wanted: Sequence[RemoteFile], complete: Iterable[str], partial_bytes: int) -> PullPlan:
    """The files still to fetch, given the paths already complete in the cache."""
    done = set(complete)
    return PullPlan(tuple(wanted), tuple(f for f in wanted if f.path not in done), partial_bytes)


def disk_shortfall(bytes_to_fetch: int, free_bytes: int, margin: int = DISK_MARGIN_BYTES) -> int:
    """Bytes missing on the disk for the download plus the margin (0 when it fits)."""
    return max(0, bytes_to_fetch + margin - free_bytes)


@dataclass(frozen=True)
class Progress:
    """How far a pull is: bytes, rate, time left."""

    done_bytes: int
    total_bytes: int
    rate: float | None
    """Bytes per second over the recent window; None before two samples."""

    @property
    def percent(self) -> float:
        return 100.0 if self.total_bytes <= 0 else min(100.0, 100.0 * self.done_bytes / self.total_bytes)

    @property
    def eta_seconds(self) -> float | None:
        if not self.rate:
            return None
        return max(0.0, (self.total_bytes - self.done_bytes) / self.rate)


class ProgressMeter:
    """The rate over the last `window` seconds of (time, bytes) samples."""

    def __init__(self, total_bytes: int, window: float = 10.0) -> None:
        self.total_bytes = total_bytes
        self.window = window
        self._samples: list[tuple[float, int]] = []

    def sample(self, now: float, done_bytes: int) -> Progress:
        self._samples.append((now, done_bytes))
        while len(self._samples) > 2 and now - self._samples[0][0] > self.window:
            self._samples.pop(0)
        first_t, first_b = self._samples[0]
        elapsed = now - first_t
        rate = (done_bytes - first_b) / elapsed if elapsed > 0 else None
        return Progress(done_bytes, self.total_bytes, rate)


def size_text(n: float) -> str:
    """Bytes for people: '512 MiB', '15.3 GiB'."""
    if n >= GIB:
        return f"{n / GIB:.1f} GiB"
    if n >= MIB:
        return f"{n / MIB:.0f} MiB"
    return f"{n / 1024:.0f} KiB"


def duration_text(seconds: float) -> str:
    s = int(seconds + 0.5)
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def progress_text(progress: Progress) -> str:
    """'3.2 GiB of 16.4 GiB (19 %), 412 MiB/s, 0:32 left'."""
    text = f"{size_text(progress.done_bytes)} of {size_text(progress.total_bytes)} ({progress.percent:.0f} %)"
    if progress.rate is not None:
        text += f", {size_text(progress.rate)}/s"
    eta = progress.eta_seconds
    if eta is not None and progress.done_bytes < progress.total_bytes:
        text += f", {duration_text(eta)} left"
    return text
