"""Tests for dankserve.host.recorded: reading recorded hosts and rejecting bad files."""

from __future__ import annotations

from pathlib import Path

import pytest

from dankserve.errors import HardwareFileError
from dankserve.exitcodes import ExitCode
from dankserve.host.recorded import read_host

HOSTS = Path(__file__).resolve().parent.parent / "hosts"


@pytest.mark.parametrize("path", sorted(HOSTS.glob("plan-*.json")), ids=lambda p: p.stem)
def test_planner_hosts_load(path: Path) -> None:
    """Every recorded host the planner's tests use loads with GPUs, cores and RAM."""
    host = read_host(path)
    assert host.gpus and host.cpu.physical_cores > 0 and host.memory.total_bytes > 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, "does not exist"),
        ("{not json", "is not JSON"),
        ('{"schema_version": 1}', "does not match the schema"),
        ('{"schema_version": 2, "cpu": {"physical_cores": 1, "logical_cores": 1}, "memory": {"total_bytes": 1}}',
         "schema_version"),
    ],
)  # fmt: skip
def test_bad_files_are_invalid_input(tmp_path: Path, text: str | None, expected: str) -> None:
    """A missing, non-JSON or off-schema file is a HardwareFileError (exit 2) naming the file."""
    path = tmp_path / "host.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(HardwareFileError) as info:
        read_host(path)
    assert info.value.exit_code == ExitCode.INVALID_INPUT
    assert str(path) in info.value.message and expected in info.value.message


def test_unknown_fields_are_ignored(tmp_path: Path) -> None:
    """Fields a newer probe adds are ignored; missing optional ones are null."""
    path = tmp_path / "host.json"
    path.write_text(
        '{"schema_version": 1, "future": 1, "cpu": {"physical_cores": 4, "logical_cores": 8},'
        ' "memory": {"total_bytes": 1024}, "gpus": [{"index": 0, "uuid": "GPU-x", "name": "n",'
        ' "memory_total_bytes": 10, "compute_capability": [9, 0], "new_field": true}]}'
    )
    host = read_host(path)
    assert host.gpus[0].numa_node is None and host.memory.available_bytes is None
