"""Live GPU memory readings for boot learning and status: NVML, or the recorded host file.

Boot learning compares free memory now with the baseline recorded before the learning boot.
On a real host that reading comes from NVML; on a machine without GPUs (tests, the demo) it
comes from the recorded host file, re-read each time so a test can change it between boots.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from dankserve.host.model import Host


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory now."""

    index: int
    uuid: str
    total_bytes: int
    free_bytes: int | None
    used_bytes: int | None
    other_processes: int | None = None
    """Compute processes NVML lists on the GPU (None when unknown)."""


def from_host(host: Host, uuids: Sequence[str]) -> dict[str, GpuMemory]:
    """Readings taken from a host description (recorded or freshly probed), by UUID."""
    out: dict[str, GpuMemory] = {}
    for gpu in host.gpus:
        if gpu.uuid in uuids:
            free = gpu.memory_free_bytes
            used = None if free is None else gpu.memory_total_bytes - free
            out[gpu.uuid] = GpuMemory(gpu.index, gpu.uuid, gpu.memory_total_bytes, free, used)
    return out


T = TypeVar("T")


def _with_nvml(read: Callable[[Any], T]) -> T | None:
    """read(pynvml) inside nvmlInit/nvmlShutdown; None when NVML is absent or a call fails."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        return read(pynvml)
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def read_nvml(uuids: Sequence[str]) -> dict[str, GpuMemory] | None:
    """Readings from NVML by UUID, or None when NVML cannot be used here."""

    def read(nvml: Any) -> dict[str, GpuMemory]:
        out: dict[str, GpuMemory] = {}
        for uuid in uuids:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                others: int | None = len(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
            except Exception:
                others = None
            index = int(nvml.nvmlDeviceGetIndex(handle))
            out[uuid] = GpuMemory(index, uuid, int(info.total), int(info.free), int(info.used), others)
        return out

    return _with_nvml(read)


def nvml_compute_pids(uuids: Sequence[str]) -> list[int] | None:
    """The pids NVML lists as compute processes on these GPUs, or None without NVML."""

    def read(nvml: Any) -> list[int]:
        pids: list[int] = []
        for uuid in uuids:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            pids += [int(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        return pids

    return _with_nvml(read)


def wait_dead_processes_released(uuids: Sequence[str], timeout: float) -> bool:
    """Wait until no process that has exited still holds memory on these GPUs (the driver frees a
    killed process's memory a moment after it dies). True when settled or NVML is absent."""
    import time

    import psutil

    deadline = time.monotonic() + timeout
    while True:
        pids = nvml_compute_pids(uuids)
        if pids is None or all(psutil.pid_exists(pid) for pid in pids):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def wait_gpu_memory_released(uuids: tuple[str, ...], timeout: float) -> None:
    """After a stop, wait until NVML lists no compute process on the GPUs (no-op without NVML)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        readings = read_nvml(uuids)
        if readings is None:
            return
        if all(r.other_processes in (0, None) for r in readings.values()):
            return
        time.sleep(0.2)
