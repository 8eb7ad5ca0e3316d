"""Tests for dankserve.supervisor.fleet.gpus: the host's GPUs over a recorded host file (stand-in GPUs)."""

from __future__ import annotations

import threading
from pathlib import Path

from dankserve.host.gpu_reader import RecordedGpus
from dankserve.host.recorded import read_host
from dankserve.supervisor.fleet.gpus import HostGpus
from dankserve.testing import write_recorded_host


def gpus(tmp_path: Path) -> HostGpus:
    path = write_recorded_host(tmp_path / "host.json", free_fraction=0.5)
    host = read_host(path)
    return HostGpus(host, RecordedGpus(path, host))


def test_a_claimed_slot_is_handed_out_once_and_holds_the_gpus_meanwhile(tmp_path: Path) -> None:
    """A start-up claim holds the GPUs' boot slot until its worker takes (and later releases) it."""
    host = gpus(tmp_path)
    uuids = (host.host.gpus[0].uuid,)
    host.claim("chat", uuids)
    assert host.slots.try_acquire(uuids) is None, "held by the claim"
    slot = host.take_claimed_slot("chat")
    assert slot is not None and host.take_claimed_slot("chat") is None
    slot.release()
    assert host.slots.acquire(uuids, threading.Event()) is not None


def test_a_recorded_host_reads_its_file_and_lists_no_other_processes(tmp_path: Path) -> None:
    """Free memory comes from the recorded file, never NVML; stand-in GPUs have no other tenants."""
    host = gpus(tmp_path)
    first = host.host.gpus[0]
    free = host.free_memory((first.uuid,))
    assert free[first.uuid].free_bytes == first.memory_total_bytes // 2
    assert host.other_processes((first.uuid,)) is False
    assert host.index_of()[first.uuid] == first.index
    assert host.utilization_band_top(()) is None
    assert host.utilization_band_top((first.uuid,)) is not None
