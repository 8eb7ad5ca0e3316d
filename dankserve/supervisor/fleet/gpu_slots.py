"""GPU boot slots: boots that share a GPU take turns, because vLLM's memory profiling fails when another
process frees or takes memory on the same GPU meanwhile. A slot is held from the GPUs' acquisition
until the boot is ready or over (a workload an earlier daemon left running holds it from start-up)."""

from __future__ import annotations

import threading
from collections.abc import Callable


class GpuBootLocks:
    """Serialises boots that share a GPU: vLLM's memory profiling fails when another process
    frees or takes memory on the same GPU meanwhile."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._holders: dict[str, str] = {}
        """Who holds each GPU's lock (a deployment's name), for `status` to say whom a boot waits for."""

    def acquire(
        self,
        uuids: tuple[str, ...],
        cancelled: threading.Event,
        holder: str = "",
        waits: Callable[[str, str], None] = lambda uuid, other: None,
    ) -> BootSlot | None:
        """Hold every GPU's lock (sorted, so no deadlock); None if cancelled while waiting.
        `waits(uuid, other)` is told whenever the lock of GPU `uuid` is held by the boot of `other`."""
        taken: list[threading.Lock] = []
        for uuid, lock in zip(sorted(set(uuids)), self._locks_of(uuids), strict=True):
            while not lock.acquire(timeout=0.2):
                waits(uuid, self.holder_of(uuid) or "another boot")
                if cancelled.is_set():
                    BootSlot(taken).release()
                    return None
            taken.append(lock)
            with self._guard:
                self._holders[uuid] = holder
        return BootSlot(taken)

    def holder_of(self, uuid: str) -> str | None:
        with self._guard:
            return self._holders.get(uuid)

    def try_acquire(self, uuids: tuple[str, ...]) -> BootSlot | None:
        """Every GPU's lock if all are free now; else None (holding none)."""
        taken: list[threading.Lock] = []
        for lock in self._locks_of(uuids):
            if not lock.acquire(blocking=False):
                BootSlot(taken).release()
                return None
            taken.append(lock)
        return BootSlot(taken)

    def _locks_of(self, uuids: tuple[str, ...]) -> list[threading.Lock]:
        with self._guard:
            return [self._locks.setdefault(u, threading.Lock()) for u in sorted(set(uuids))]


class BootSlot:
    """The right to boot on some GPUs; released once the boot is ready or over."""

    def __init__(self, locks: list[threading.Lock]) -> None:
        self._locks = locks
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            for lock in reversed(self._locks):
                lock.release()
