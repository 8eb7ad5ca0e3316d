"""CPUs, memory, NUMA nodes and disk space, through psutil and sysfs.

The sysfs root is a parameter so tests can hand in a directory laid out like
`/sys/devices/system/node`; the parsers of its files (`parse_cpulist`, `parse_node_memtotal`)
and the core-count rule (`core_counts`) are pure.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dankserve.host.model import Cpu, Disk, Memory, NumaNode

SYSFS_ROOT = Path("/sys")

_NODE_DIR = re.compile(r"^node(\d+)$")
_MEMTOTAL = re.compile(r"^Node\s+\d+\s+MemTotal:\s+(\d+)\s*kB\s*$", re.MULTILINE)


@dataclass(frozen=True)
class CpuFacts:
    """CPU, memory and NUMA readings, with what could not be read exactly."""

    cpu: Cpu
    memory: Memory
    numa_nodes: tuple[NumaNode, ...]
    warnings: tuple[str, ...]


# ---- pure part --------------------------------------------------------------------------


def parse_cpulist(text: str) -> tuple[int, ...]:
    """The CPUs of a kernel cpulist such as '0-3,8-11' (empty text: none), sorted and distinct."""
    cpus: set[int] = set()
    for raw_part in text.strip().split(","):
        part = raw_part.strip()
        if not part:
            continue
        first, sep, last = part.partition("-")
        try:
            low = int(first)
            high = int(last) if sep else low
        except ValueError:
            raise ValueError(f"{text.strip()!r} is not a CPU list like 0-3,8-11") from None
        if low < 0 or high < low:
            raise ValueError(f"{text.strip()!r} is not a CPU list like 0-3,8-11 (range {part!r})")
        cpus.update(range(low, high + 1))
    return tuple(sorted(cpus))


def format_cpulist(cpus: Iterable[int]) -> str:
    """The kernel's compact cpulist form of some CPUs: (0, 1, 2, 3, 8) -> '0-3,8'."""
    ranges: list[str] = []
    ordered = sorted(set(cpus))
    start = 0
    for position in range(1, len(ordered) + 1):
        if position == len(ordered) or ordered[position] != ordered[position - 1] + 1:
            low, high = ordered[start], ordered[position - 1]
            ranges.append(str(low) if low == high else f"{low}-{high}")
            start = position
    return ",".join(ranges)


def parse_node_memtotal(meminfo: str) -> int | None:
    """Bytes of a NUMA node's memory from its sysfs meminfo ('Node 0 MemTotal: 263869908 kB')."""
    match = _MEMTOTAL.search(meminfo)
    return int(match.group(1)) * 1024 if match else None


def core_counts(physical: int | None, logical: int | None) -> tuple[Cpu, tuple[str, ...]]:
    """Core counts with a warning for each guess: unknown physical cores count as the logical ones."""
    warnings: list[str] = []
    if not logical or logical < 1:
        warnings.append("the number of logical CPUs is unknown: assuming 1")
        logical = 1
    if not physical or physical < 1:
        warnings.append(
            f"the number of physical CPU cores is unknown: assuming {logical}, the logical CPU count "
            "(with SMT the real number is lower)"
        )
        physical = logical
    return Cpu(physical_cores=physical, logical_cores=logical), tuple(warnings)


# ---- I/O part ---------------------------------------------------------------------------


def read_numa_nodes(sysfs_root: Path = SYSFS_ROOT) -> tuple[tuple[NumaNode, ...], tuple[str, ...]]:
    """The NUMA nodes under <sysfs_root>/devices/system/node, sorted by id, and any warnings."""
    base = sysfs_root / "devices" / "system" / "node"
    try:
        entries = sorted(
            (int(match.group(1)), path) for path in base.iterdir() if (match := _NODE_DIR.match(path.name)) is not None
        )
    except OSError:
        return (), (f"NUMA layout unknown: {base} cannot be read",)
    nodes: list[NumaNode] = []
    warnings: list[str] = []
    for node_id, path in entries:
        try:
            cpus = parse_cpulist((path / "cpulist").read_text())
        except (OSError, ValueError) as exc:
            warnings.append(f"NUMA node {node_id}: CPU list unreadable ({exc})")
            cpus = ()
        try:
            memory = parse_node_memtotal((path / "meminfo").read_text())
        except OSError:
            memory = None
        if memory is None:
            warnings.append(f"NUMA node {node_id}: memory size unreadable from {path / 'meminfo'}")
        nodes.append(NumaNode(id=node_id, cpus=cpus, memory_total_bytes=memory))
    if not nodes:
        warnings.append(f"NUMA layout unknown: no node directories under {base}")
    return tuple(nodes), tuple(warnings)


def read_cpu(sysfs_root: Path = SYSFS_ROOT) -> CpuFacts:
    """Cores and memory through psutil, NUMA nodes through sysfs."""
    import psutil

    cpu, core_warnings = core_counts(psutil.cpu_count(logical=False), psutil.cpu_count(logical=True))
    ram = psutil.virtual_memory()
    swap = psutil.swap_memory()
    nodes, numa_warnings = read_numa_nodes(sysfs_root)
    return CpuFacts(
        cpu=cpu,
        memory=Memory(total_bytes=ram.total, available_bytes=ram.available, swap_total_bytes=swap.total),
        numa_nodes=nodes,
        warnings=core_warnings + numa_warnings,
    )


def nearest_existing(path: Path) -> Path:
    """The path itself if it exists, else its nearest existing parent (a cache dir not made yet)."""
    candidate = path.absolute()
    while not candidate.exists() and candidate != candidate.parent:
        candidate = candidate.parent
    return candidate


def read_disks(paths: Sequence[Path]) -> tuple[Disk, ...]:
    """Free and total space of the file system holding each path (each path once, in order)."""
    disks: list[Disk] = []
    for path in dict.fromkeys(paths):
        usage = shutil.disk_usage(nearest_existing(path))
        disks.append(Disk(path=os.fspath(path), free_bytes=usage.free, total_bytes=usage.total))
    return tuple(disks)
