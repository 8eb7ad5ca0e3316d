"""The daemon's one reader of its GPUs now, chosen once at start (`gpu_reader`): NVML on a GPU host, or the
recorded host file that drives a test, demo or try-it run (stand-in GPUs). Nothing downstream asks which.

Either answers the same questions: each GPU's memory now, the free memory boot learning compares
with its baseline, whether other processes hold the GPUs (and their free bytes, for the failure
policy after an OOM), and the bytes given processes hold (a sleeping server's check).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from dankserve.host.gpu_memory import GpuMemory, from_host, read_nvml
from dankserve.host.gpu_processes import held_bytes, stand_in_dir
from dankserve.host.model import Host


class GpuReader(Protocol):
    """This host's GPUs read now."""

    def memory(self, uuids: Sequence[str]) -> dict[str, GpuMemory]:
        """Each GPU's memory now; what cannot be read now is taken from the host as probed at start."""
        ...

    def free_memory(self, uuids: Sequence[str]) -> dict[str, GpuMemory]:
        """Free memory for boot learning: never a start-up snapshot (a GPU not read now is left out)."""
        ...

    def tenants(self, uuids: Sequence[str]) -> tuple[bool | None, tuple[int | None, ...]]:
        """Whether processes hold these GPUs (ours are stopped when this is asked; None: unknown), and each GPU's
        free bytes in `uuids`' order (None: unknown), from one reading."""
        ...

    def held(self, pids: Collection[int], uuids: Sequence[str]) -> dict[str, int] | None:
        """Bytes these processes hold on each of these GPUs (None: cannot be read)."""
        ...


@dataclass(frozen=True)
class NvmlGpus:
    """A GPU host: NVML."""

    host: Host
    """As probed at start."""

    def memory(self, uuids: Sequence[str]) -> dict[str, GpuMemory]:
        readings = read_nvml(uuids)
        return readings if readings is not None else from_host(self.host, uuids)

    def free_memory(self, uuids: Sequence[str]) -> dict[str, GpuMemory]:
        return read_nvml(uuids) or {}

    def tenants(self, uuids: Sequence[str]) -> tuple[bool | None, tuple[int | None, ...]]:
        readings = read_nvml(uuids)
        if readings is None:
            return None, tuple(None for _ in uuids)
        free = tuple(readings[u].free_bytes if u in readings else None for u in uuids)
        if any(r.other_processes is None for r in readings.values()):
            return None, free
        return any((r.other_processes or 0) > 0 for r in readings.values()), free

    def held(self, pids: Collection[int], uuids: Sequence[str]) -> dict[str, int] | None:
        return held_bytes(pids, uuids, None)


@dataclass(frozen=True)
class RecordedGpus:
    """Stand-in GPUs: the recorded host file (re-read each time, so a test can change it between boots) and the
    stand-in vLLM's per-process records beside it. Stand-in GPUs have no other tenants."""

    hardware_file: Path
    host: Host
    """As read at start (what a reading falls back to when the file cannot be read now)."""

    def memory(self, uuids: Sequence[str]) -> dict[str, GpuMemory]:
        from dankserve.host.recorded import read_host

        try:
            return from_host(read_host(self.hardware_file), uuids)
        except Exception:  # a file a test is rewriting, or gone: the host as read at start
            return from_host(self.host, uuids)

    def free_memory(self, uuids: Sequence[str]) -> dict[str, GpuMemory]:
        return self.memory(uuids)

    def tenants(self, uuids: Sequence[str]) -> tuple[bool | None, tuple[int | None, ...]]:
        memory = self.memory(uuids)
        return False, tuple(memory[u].free_bytes if u in memory else None for u in uuids)

    def held(self, pids: Collection[int], uuids: Sequence[str]) -> dict[str, int] | None:
        return held_bytes(pids, uuids, stand_in_dir(self.hardware_file))


def gpu_reader(hardware_file: Path | None, host: Host) -> GpuReader:
    """The reader for this run (`host`: as loaded at start): the recorded host file where one drives it, else
    NVML. The one place that chooses."""
    return NvmlGpus(host) if hardware_file is None else RecordedGpus(hardware_file, host)
