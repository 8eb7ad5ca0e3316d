"""`dankserve probe`: show (or save) what dankserve knows about this host.

Settings are loaded only to find the cache directories of a live probe: a recorded host
already carries its disks, which keeps `probe --json --hardware FILE` quick.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from dankserve.cli.context import cli_context
from dankserve.cli.render import format_bytes, print_json
from dankserve.exitcodes import ExitCode
from dankserve.host.model import Cpu, Disk, Host, Memory, NumaNode
from dankserve.host.probe import load_host


def _cache_dirs() -> list[Path]:
    settings = cli_context().load_settings()
    return [settings.state_dir, settings.cache_dir, settings.hf_cache_dir]


@click.command("probe")
@click.option("--json", "as_json", is_flag=True, help="Print the recorded-host JSON instead of a table.")
@click.option(
    "--save",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Also write the recorded-host JSON to FILE (for --hardware elsewhere).",
)
@click.option(
    "--hardware",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Read a recorded host instead of probing (default $DANKSERVE_HARDWARE).",
)
def command(as_json: bool, save: Path | None, hardware: Path | None) -> ExitCode:
    """Probe GPUs (NVML), CPUs, memory, NUMA nodes and cache-disk space; print or save them.

    With --hardware (or DANKSERVE_HARDWARE) the first line says the host is a recorded file, not this machine.
    Without a usable GPU the CPUs, memory, NUMA nodes and disks are still printed before the error (exit 3)."""
    from dankserve.errors import NvmlUnavailable
    from dankserve.host.probe import hardware_file

    recorded = hardware_file(hardware)
    try:
        host = load_host(hardware, _cache_dirs)
    except NvmlUnavailable:
        if not as_json and save is None:  # what else this machine has, then the GPU error and its fix
            _print_without_gpus(_cache_dirs())
        raise
    if recorded is not None and not as_json:
        click.echo(f"recorded host {recorded} ({host.hostname or 'unnamed'}), not this machine: read from the file")
    if save is not None:
        from dankserve.host.recorded import write_host

        write_host(host, save)
        click.echo(f"saved the host description to {save}", err=True)
    for warning in host.warnings:
        click.echo(f"warning: {warning}", err=True)
    if as_json:
        from dankserve.host.recorded import host_to_json

        print_json(host_to_json(host))
    else:
        _print_text(host)
    return ExitCode.OK


def _print_text(host: Host) -> None:
    from rich.table import Table

    from dankserve.cli.console import console as stdout_console

    table = Table(title=f"GPUs (driver {host.driver_version or '?'}, CUDA {host.cuda_version or '?'})")
    for header in ("#", "name", "memory", "free", "cc", "PCI bus id", "NUMA", "MIG", "UUID"):
        table.add_column(header, overflow="fold")
    for gpu in host.gpus:
        table.add_row(
            str(gpu.index),
            gpu.name,
            format_bytes(gpu.memory_total_bytes),
            format_bytes(gpu.memory_free_bytes),
            "{}.{}".format(*gpu.compute_capability),
            gpu.pci_bus_id or "-",
            _known(gpu.numa_node),
            "-" if gpu.mig_mode is None else ("on" if gpu.mig_mode else "off"),
            gpu.uuid,
        )
    # no emoji codes (":AB:" in a bus id), no markup; unlimited width when piped, so nothing wraps
    console = stdout_console(highlight=False, emoji=False, markup=False, width=None if _is_terminal() else 200)
    console.print(table)
    lines = [*machine_lines(host.cpu, host.memory, host.numa_nodes, host.disks), *links_matrix(host)]
    for line in lines:
        console.print(line, soft_wrap=True)


def _print_without_gpus(cache_dirs: list[Path]) -> None:
    from dankserve.cli.console import console as stdout_console
    from dankserve.host.cpu import read_cpu, read_disks

    facts = read_cpu()
    console = stdout_console(highlight=False, emoji=False, markup=False, width=None if _is_terminal() else 200)
    console.print("GPUs: none usable (below)", soft_wrap=True)
    for line in machine_lines(facts.cpu, facts.memory, facts.numa_nodes, read_disks(cache_dirs)):
        console.print(line, soft_wrap=True)


def machine_lines(cpu: Cpu, memory: Memory, numa_nodes: Sequence[NumaNode], disks: Sequence[Disk]) -> list[str]:
    """The CPU, memory, NUMA and disk lines of `probe` (with or without GPUs)."""
    from dankserve.host.cpu import format_cpulist

    lines = [
        f"CPU: {cpu.physical_cores} physical cores, {cpu.logical_cores} logical",
        f"RAM: {format_bytes(memory.total_bytes)} total, {format_bytes(memory.available_bytes)} available; "
        f"swap {format_bytes(memory.swap_total_bytes)}",
    ]
    lines += [
        f"NUMA node {node.id}: CPUs {format_cpulist(node.cpus) or '-'}, memory {format_bytes(node.memory_total_bytes)}"
        for node in numa_nodes
    ]
    lines += [f"disk {disk.path}: {format_bytes(disk.free_bytes)} free" for disk in disks]
    return lines


def links_matrix(host: Host) -> list[str]:
    """The links between GPUs as `nvidia-smi topo -m` shows them (NV18, PXB, SYS...), GPUs in dankserve's order."""
    if len(host.gpus) < 2:
        return []
    if host.links is None:
        return ["links between GPUs: not recorded"]
    names = [f"GPU{gpu.index}" for gpu in host.gpus]
    width = max(5, *(len(name) + 1 for name in names))

    def cell(a: int, b: int) -> str:
        if a == b:
            return " X"
        link = host.link(a, b)
        return "?" if link is None else link.label()

    rows = ["links between GPUs (as nvidia-smi topo -m; NV# = # NVLinks, else the PCIe path PIX/PXB/PHB/NODE/SYS):"]
    rows.append(" " * width + "".join(name.ljust(width) for name in names) + "NUMA")
    for gpu, name in zip(host.gpus, names, strict=True):
        cells = "".join(cell(gpu.index, other.index).ljust(width) for other in host.gpus)
        rows.append(name.ljust(width) + cells + _known(gpu.numa_node))
    return rows


def _is_terminal() -> bool:
    import sys

    return sys.stdout.isatty()


def _known(value: int | None) -> str:
    return "-" if value is None else str(value)
