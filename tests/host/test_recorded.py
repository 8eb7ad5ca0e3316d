"""Tests for dankserve.host.recorded: reading, validating and atomically writing recorded hosts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dankserve.errors import HardwareFileError
from dankserve.exitcodes import ExitCode
from dankserve.host.recorded import host_from_json, host_to_json, read_host, write_host
from dankserve.testing import recorded_host, recorded_host_names, recorded_host_path

MINIMAL: dict[str, Any] = {
    "schema_version": 1,
    "gpus": [
        {
            "index": 0,
            "uuid": "GPU-1",
            "name": "NVIDIA H200",
            "memory_total_bytes": 150754820096,
            "compute_capability": [9, 0],
        }
    ],
    "cpu": {"physical_cores": 16, "logical_cores": 32},
    "memory": {"total_bytes": 2**37},
}


def write_json(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "host.json"
    path.write_text(json.dumps(data))
    return path


def with_changes(path: str, value: object) -> dict[str, Any]:
    """MINIMAL with one field (dotted path, list indices as numbers) replaced or, for ..., removed."""
    data: dict[str, Any] = json.loads(json.dumps(MINIMAL))
    *parents, last = path.split(".")
    target: Any = data
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    if value is ...:
        del target[last]
    else:
        target[last] = value
    return data


def test_shipped_hosts_cover_the_issue() -> None:
    """The recorded hosts span the GPU models, 1/2/4/8 GPUs, 1 and 2 NUMA nodes, MIG and a 4-core host."""
    hosts = [recorded_host(name) for name in recorded_host_names()]
    names = {gpu.name for host in hosts for gpu in host.gpus}
    for model in ("RTX 3090", "RTX 4090", "A100-SXM4-40GB", "A100-SXM4-80GB", "H100 80GB", "H200"):
        assert any(model in name for name in names), model
    assert {len(host.gpus) for host in hosts} >= {1, 2, 4, 8}
    assert {len(host.numa_nodes) for host in hosts} >= {1, 2}
    assert any(gpu.mig_mode for host in hosts for gpu in host.gpus)
    assert any(host.cpu.physical_cores == 4 for host in hosts)


@pytest.mark.parametrize("name", recorded_host_names())
def test_shipped_host_is_consistent(name: str) -> None:
    """Each recorded host is in PCI bus order, its GPUs' NUMA nodes exist and its nodes cover its CPUs."""
    host = recorded_host(name)
    assert [gpu.index for gpu in host.gpus] == list(range(len(host.gpus)))
    assert [gpu.pci_bus_id for gpu in host.gpus] == sorted(gpu.pci_bus_id or "" for gpu in host.gpus)
    node_ids = {node.id for node in host.numa_nodes}
    assert all(gpu.numa_node is None or gpu.numa_node in node_ids for gpu in host.gpus)
    cpus = [cpu for node in host.numa_nodes for cpu in node.cpus]
    assert sorted(cpus) == list(range(host.cpu.logical_cores))


@pytest.mark.parametrize("name", recorded_host_names())
def test_shipped_host_round_trips(tmp_path: Path, name: str) -> None:
    """Writing a recorded host and reading it back gives an equal host."""
    host = recorded_host(name)
    write_host(host, tmp_path / "copy.json")
    assert read_host(tmp_path / "copy.json") == host


def test_real_nvml_memory_totals() -> None:
    """Recorded GPUs carry the byte totals NVML reports for their model."""
    totals = {gpu.name: gpu.memory_total_bytes for name in recorded_host_names() for gpu in recorded_host(name).gpus}
    assert totals["NVIDIA GeForce RTX 4090"] == 25757220864
    assert totals["NVIDIA A100-SXM4-80GB"] == 85899345920
    assert totals["NVIDIA H100 80GB HBM3"] == 85520809984
    assert totals["NVIDIA H200"] == 150754820096 == 143771 * 2**20


def test_missing_optional_fields_are_null() -> None:
    """A file with only the required fields loads; every optional field is null or empty."""
    host = host_from_json(MINIMAL, "f.json")
    gpu = host.gpus[0]
    assert (gpu.memory_free_bytes, gpu.numa_node, gpu.pci_bus_id, gpu.mig_mode) == (None, None, None, None)
    assert (host.memory.available_bytes, host.memory.swap_total_bytes) == (None, None)
    assert (host.driver_version, host.cuda_version, host.numa_nodes, host.disks) == (None, None, (), ())


def test_unknown_fields_are_ignored() -> None:
    """Fields this version does not know, at any level, are ignored."""
    data = with_changes("gpus.0.power_limit_watts", 700)
    data["future_section"] = {"x": 1}
    assert host_from_json(data, "f.json") == host_from_json(MINIMAL, "f.json")


def test_schema_version_defaults_to_one() -> None:
    """A file without schema_version reads as version 1."""
    assert host_from_json(with_changes("schema_version", ...), "f.json").schema_version == 1


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (with_changes("gpus.0.uuid", ...), "gpus.0.uuid: missing (required)"),
        (with_changes("cpu", ...), "cpu: missing (required)"),
        (with_changes("gpus.0.compute_capability", "9.0"), "gpus.0.compute_capability = '9.0'"),
        (with_changes("gpus.0.memory_total_bytes", -1), "gpus.0.memory_total_bytes = -1: Input should be greater"),
        (with_changes("gpus.0.pci_bus_id", "17:00.0"), "gpus.0.pci_bus_id = '17:00.0': '17:00.0' is not a PCI bus"),
        (with_changes("cpu.physical_cores", "many"), "cpu.physical_cores = 'many'"),
        (with_changes("schema_version", 2), "schema_version = 2: this dankserve reads version 1"),
        ([1, 2], "expected a JSON object at the top level, found list"),
    ],
)
def test_malformed_content_names_field_and_problem(data: object, expected: str) -> None:
    """Off-schema content raises HardwareFileError (exit 2) naming the file, the field and the problem."""
    with pytest.raises(HardwareFileError) as info:
        host_from_json(data, "recorded/host.json")
    assert info.value.exit_code == ExitCode.INVALID_INPUT
    assert info.value.message.startswith("hardware file recorded/host.json")
    assert expected in info.value.message
    assert info.value.fix


def test_duplicate_gpu_index_is_malformed() -> None:
    """Two GPUs with one index make the file malformed, naming gpus."""
    data = json.loads(json.dumps(MINIMAL))
    data["gpus"].append({**data["gpus"][0], "uuid": "GPU-2"})
    with pytest.raises(HardwareFileError, match="gpus: two GPUs share the index 0"):
        host_from_json(data, "f.json")


@pytest.mark.parametrize(
    ("content", "expected"),
    [("{not json", "Expecting property name enclosed in double quotes at line 1, column 2"), ("", "at line 1")],
)
def test_not_json(tmp_path: Path, content: str, expected: str) -> None:
    """A file that is not JSON is named, with the parser's position."""
    path = tmp_path / "host.json"
    path.write_text(content)
    with pytest.raises(HardwareFileError, match=f"hardware file {path} is not valid JSON") as info:
        read_host(path)
    assert expected in info.value.message


def test_missing_file(tmp_path: Path) -> None:
    """A missing file is invalid input naming the path."""
    with pytest.raises(HardwareFileError, match="does not exist"):
        read_host(tmp_path / "absent.json")


def test_directory_is_unreadable(tmp_path: Path) -> None:
    """A directory given as the file is reported as unreadable, not as a crash."""
    with pytest.raises(HardwareFileError, match="cannot be read"):
        read_host(tmp_path)


def test_write_replaces_atomically(tmp_path: Path) -> None:
    """Writing over an existing file replaces it whole and leaves no temporary file behind."""
    path = tmp_path / "host.json"
    path.write_text("old")
    host = recorded_host("h100x4-2numa")
    write_host(host, path)
    assert [p.name for p in tmp_path.iterdir()] == ["host.json"]
    assert json.loads(path.read_text()) == host_to_json(host)


def test_write_into_missing_directory_is_invalid_input(tmp_path: Path) -> None:
    """Saving into a directory that does not exist is invalid input naming the file."""
    target = tmp_path / "no" / "host.json"
    with pytest.raises(HardwareFileError, match=f"cannot write hardware file {target}"):
        write_host(recorded_host("h200x1-vm"), target)


def test_json_shape_matches_issue() -> None:
    """The JSON has the issue's field names and a [major, minor] compute capability."""
    data = host_to_json(recorded_host("h200x1-vm"))
    assert list(data)[:7] == ["schema_version", "gpus", "cpu", "memory", "numa_nodes", "driver_version", "cuda_version"]
    assert data["gpus"][0]["compute_capability"] == [9, 0]
    assert set(data["gpus"][0]) >= {"index", "uuid", "name", "memory_total_bytes", "memory_free_bytes", "numa_node"}
    assert set(data["memory"]) == {"total_bytes", "available_bytes", "swap_total_bytes"}


def test_recorded_host_path_unknown_name() -> None:
    """Asking for an unknown recorded host lists the known ones."""
    with pytest.raises(FileNotFoundError, match="h100x4-2numa"):
        recorded_host_path("nope")
    assert recorded_host_path("h100x4-2numa.json") == recorded_host_path("h100x4-2numa")
