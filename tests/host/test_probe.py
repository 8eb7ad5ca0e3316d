"""Tests for dankserve.host.probe: choosing a recorded host or a live probe, and the live probe itself."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dankserve.errors import NvmlUnavailable
from dankserve.host.probe import HARDWARE_ENV, hardware_file, load_host, probe_host
from dankserve.testing import recorded_host, recorded_host_path
from tests.harness.gpus import nvml_unusable_reason


@pytest.mark.parametrize(
    ("explicit", "environ", "expected"),
    [
        (Path("a.json"), {HARDWARE_ENV: "b.json"}, Path("a.json")),
        (None, {HARDWARE_ENV: "b.json"}, Path("b.json")),
        (None, {HARDWARE_ENV: ""}, None),
        (None, {}, None),
    ],
)
def test_hardware_file_precedence(explicit: Path | None, environ: dict[str, str], expected: Path | None) -> None:
    """--hardware wins over $DANKSERVE_HARDWARE; an empty or absent variable means probe."""
    assert hardware_file(explicit, environ) == expected


def test_load_host_reads_the_named_file_without_cache_dirs() -> None:
    """A recorded host is read as is, and the cache-dir function (settings) is never called."""

    def cache_dirs() -> list[Path]:
        raise AssertionError("settings were loaded for a recorded host")

    path = recorded_host_path("h100x4-2numa")
    assert load_host(path, cache_dirs, environ={}) == recorded_host("h100x4-2numa")
    assert load_host(None, cache_dirs, environ={HARDWARE_ENV: str(path)}) == recorded_host("h100x4-2numa")


@pytest.mark.skipif(nvml_unusable_reason() is None, reason="NVML works here")
def test_load_host_without_gpu_is_environment_error(tmp_path: Path) -> None:
    """Without a recorded host and without NVML, loading the host raises NvmlUnavailable (exit 3)."""
    with pytest.raises(NvmlUnavailable) as info:
        load_host(None, [tmp_path], environ={})
    assert info.value.exit_code == 3


@pytest.mark.gpu
def test_probe_host_on_real_gpus(tmp_path: Path) -> None:
    """The live probe finds the GPUs in bus order, this machine's CPUs, NUMA nodes and the cache disks."""
    host = probe_host([tmp_path, tmp_path / "not-yet"])
    assert host.gpus
    assert [gpu.index for gpu in host.gpus] == list(range(len(host.gpus)))
    assert all(gpu.compute_capability >= (7, 0) for gpu in host.gpus)
    assert host.driver_version and host.cuda_version
    assert host.cpu.logical_cores == os.cpu_count()
    # RAM on the GPU VMs grows as it is used: only its presence is checked
    assert host.memory.total_bytes > 0
    node_ids = {node.id for node in host.numa_nodes}
    assert all(gpu.numa_node is None or gpu.numa_node in node_ids for gpu in host.gpus)
    assert [disk.path for disk in host.disks] == [str(tmp_path), str(tmp_path / "not-yet")]
