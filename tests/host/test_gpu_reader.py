"""Tests for dankserve.host.gpu_reader: the one choice of GPU reader (NVML or a recorded host) and the recorded
host's answers (stand-in GPUs: the file re-read each time, no other tenants)."""

from __future__ import annotations

import json
from pathlib import Path

from dankserve.host.gpu_reader import NvmlGpus, RecordedGpus, gpu_reader
from dankserve.host.recorded import read_host
from dankserve.testing import write_recorded_host


def test_a_hardware_file_chooses_the_recorded_reader_and_none_chooses_nvml(tmp_path: Path) -> None:
    path = write_recorded_host(tmp_path / "host.json")
    host = read_host(path)
    assert gpu_reader(path, host) == RecordedGpus(path, host)
    assert gpu_reader(None, host) == NvmlGpus(host)


def test_the_recorded_reader_reads_the_file_now_and_falls_back_to_the_host_read_at_start(tmp_path: Path) -> None:
    """A test may change the file between boots: each reading sees it; a file gone falls back to the start's host;
    stand-in GPUs have no other tenants."""
    path = write_recorded_host(tmp_path / "host.json", free_fraction=0.5)
    host = read_host(path)
    reader = RecordedGpus(path, host)
    first = host.gpus[0]
    assert reader.free_memory((first.uuid,))[first.uuid].free_bytes == first.memory_total_bytes // 2
    data = json.loads(path.read_text())
    data["gpus"][0]["memory_free_bytes"] = 1234
    path.write_text(json.dumps(data))
    assert reader.memory((first.uuid,))[first.uuid].free_bytes == 1234
    assert reader.tenants((first.uuid,)) == (False, (1234,))
    path.unlink()
    assert reader.memory((first.uuid,))[first.uuid].free_bytes == first.memory_total_bytes // 2
    assert reader.held([], (first.uuid,)) is None, "no processes: nothing to read"
