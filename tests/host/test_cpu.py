"""Tests for dankserve.host.cpu: cpulist parsing, core counts, NUMA from a sysfs tree, disks."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dankserve.host.cpu import (
    core_counts,
    format_cpulist,
    nearest_existing,
    parse_cpulist,
    parse_node_memtotal,
    read_cpu,
    read_disks,
    read_numa_nodes,
)
from dankserve.host.model import Cpu


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("", ()),
        ("\n", ()),
        ("0", (0,)),
        ("0-3", (0, 1, 2, 3)),
        ("0-3,8-11\n", (0, 1, 2, 3, 8, 9, 10, 11)),
        ("0-1,64-65", (0, 1, 64, 65)),
        ("5,1-2", (1, 2, 5)),
        ("0-2,1-3", (0, 1, 2, 3)),
        (" 0 - 1 , 4 ", (0, 1, 4)),
    ],
)
def test_parse_cpulist(text: str, cpus: tuple[int, ...]) -> None:
    """Kernel cpulists (ranges and single CPUs, comma separated) read as sorted distinct CPUs."""
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["a", "0-b", "3-1", "-1", "0-3-5"])
def test_parse_cpulist_rejects_garbage(text: str) -> None:
    """Text that is not a cpulist raises ValueError quoting it."""
    with pytest.raises(ValueError, match="not a CPU list"):
        parse_cpulist(text)


@pytest.mark.parametrize(
    ("cpus", "text"),
    [((), ""), ((0,), "0"), ((0, 1, 2, 3, 8), "0-3,8"), ((3, 1, 2), "1-3"), ((0, 2, 4), "0,2,4")],
)
def test_format_cpulist(cpus: tuple[int, ...], text: str) -> None:
    """CPUs print in the kernel's compact cpulist form."""
    assert format_cpulist(cpus) == text


@given(st.sets(st.integers(min_value=0, max_value=512)))
def test_cpulist_round_trip(cpus: set[int]) -> None:
    """Formatting then parsing a set of CPUs gives the same CPUs back."""
    assert parse_cpulist(format_cpulist(cpus)) == tuple(sorted(cpus))


@pytest.mark.parametrize(
    ("meminfo", "expected"),
    [
        ("Node 0 MemTotal:       263869908 kB\nNode 0 MemFree:  1 kB\n", 263869908 * 1024),
        ("Node 12 MemTotal: 4 kB\n", 4096),
        ("Node 0 MemFree: 1 kB\n", None),
        ("", None),
    ],
)
def test_parse_node_memtotal(meminfo: str, expected: int | None) -> None:
    """A node's MemTotal line gives its memory in bytes; without one it is unknown."""
    assert parse_node_memtotal(meminfo) == expected


@pytest.mark.parametrize(
    ("physical", "logical", "cpu", "warned"),
    [
        (8, 16, Cpu(physical_cores=8, logical_cores=16), False),
        (None, 16, Cpu(physical_cores=16, logical_cores=16), True),
        (0, 4, Cpu(physical_cores=4, logical_cores=4), True),
        (None, None, Cpu(physical_cores=1, logical_cores=1), True),
    ],
)
def test_core_counts(physical: int | None, logical: int | None, cpu: Cpu, warned: bool) -> None:
    """Unknown physical cores count as the logical ones, with a warning; known counts pass unchanged."""
    result, warnings = core_counts(physical, logical)
    assert result == cpu
    assert bool(warnings) is warned
    if physical is None and logical:
        assert "physical CPU cores is unknown" in warnings[0]


def make_node(root: Path, node: int, cpulist: str | None, mem_kb: int | None) -> None:
    path = root / "devices" / "system" / "node" / f"node{node}"
    path.mkdir(parents=True)
    if cpulist is not None:
        (path / "cpulist").write_text(cpulist + "\n")
    if mem_kb is not None:
        (path / "meminfo").write_text(f"Node {node} MemTotal:       {mem_kb} kB\nNode {node} MemFree: 1 kB\n")


def test_read_numa_nodes_two_sockets(tmp_path: Path) -> None:
    """Each node directory gives its CPUs and memory, sorted numerically by node id."""
    make_node(tmp_path, 1, "32-63,96-127", 500 * 2**20)
    make_node(tmp_path, 0, "0-31,64-95", 501 * 2**20)
    (tmp_path / "devices" / "system" / "node" / "possible").write_text("0-1\n")
    nodes, warnings = read_numa_nodes(tmp_path)
    assert warnings == ()
    assert [node.id for node in nodes] == [0, 1]
    assert nodes[0].cpus == (*range(32), *range(64, 96))
    assert nodes[1].memory_total_bytes == 500 * 2**30


def test_read_numa_nodes_order_and_memory_only_node(tmp_path: Path) -> None:
    """node10 sorts after node2, and a memory-only node (empty cpulist) has no CPUs."""
    make_node(tmp_path, 10, "", 96 * 2**20)
    make_node(tmp_path, 2, "0-3", 16 * 2**20)
    nodes, warnings = read_numa_nodes(tmp_path)
    assert [(node.id, node.cpus) for node in nodes] == [(2, (0, 1, 2, 3)), (10, ())]
    assert warnings == ()


def test_read_numa_nodes_unreadable_parts_warn(tmp_path: Path) -> None:
    """A node without meminfo or with a broken cpulist is kept, with a warning naming it."""
    make_node(tmp_path, 0, "zero", None)
    nodes, warnings = read_numa_nodes(tmp_path)
    assert nodes[0].cpus == () and nodes[0].memory_total_bytes is None
    assert len(warnings) == 2 and all("NUMA node 0" in warning for warning in warnings)


def test_read_numa_nodes_without_sysfs(tmp_path: Path) -> None:
    """Without a node directory the NUMA layout is empty, with a warning."""
    nodes, warnings = read_numa_nodes(tmp_path)
    assert nodes == ()
    assert "NUMA layout unknown" in warnings[0]


def test_read_cpu_on_this_machine() -> None:
    """The live reading agrees with the operating system's CPU count and covers every CPU in NUMA nodes."""
    facts = read_cpu()
    assert facts.cpu.logical_cores == os.cpu_count()
    assert 1 <= facts.cpu.physical_cores <= facts.cpu.logical_cores
    assert facts.memory.total_bytes > 0
    if facts.numa_nodes:
        covered = {cpu for node in facts.numa_nodes for cpu in node.cpus}
        assert covered >= os.sched_getaffinity(0)


def test_nearest_existing(tmp_path: Path) -> None:
    """A path that does not exist yet resolves to its nearest existing parent."""
    assert nearest_existing(tmp_path / "a" / "b") == tmp_path
    assert nearest_existing(tmp_path) == tmp_path


def test_read_disks(tmp_path: Path) -> None:
    """Each cache dir appears once, in order, with its file system's free and total space."""
    missing = tmp_path / "not" / "yet"
    disks = read_disks([tmp_path, missing, tmp_path])
    assert [disk.path for disk in disks] == [str(tmp_path), str(missing)]
    usage = shutil.disk_usage(tmp_path)
    assert disks[1].total_bytes == usage.total
    assert all(0 <= disk.free_bytes <= (disk.total_bytes or 0) for disk in disks)
