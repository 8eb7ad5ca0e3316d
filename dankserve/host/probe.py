"""Where every command gets its Host: a recorded-host file when one is named, else a live probe.

`--hardware FILE` (or `$DANKSERVE_HARDWARE`) reads a host recorded with `dankserve probe
--save`, so planning works on a machine without the GPUs; otherwise NVML, psutil and sysfs
are read here.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from dankserve.host.model import Host

HARDWARE_ENV = "DANKSERVE_HARDWARE"

CacheDirs = Sequence[Path] | Callable[[], Sequence[Path]]


def probe_host(cache_dirs: Sequence[Path] = (), *, sysfs_root: Path = Path("/sys")) -> Host:
    """Probe this machine: GPUs (NvmlUnavailable, exit 3, without any), CPUs, memory, NUMA, disks."""
    from dankserve.host.cpu import read_cpu, read_disks
    from dankserve.host.nvml import gpus_from_readings, read_nvml

    readings = read_nvml(sysfs_root)  # first: no GPU means nothing else matters
    cpu = read_cpu(sysfs_root)
    cpu_nodes = {node.id for node in cpu.numa_nodes if node.cpus} or None
    gpu = gpus_from_readings(readings, cpu_nodes)
    return Host(
        gpus=gpu.gpus,
        cpu=cpu.cpu,
        memory=cpu.memory,
        numa_nodes=cpu.numa_nodes,
        driver_version=gpu.driver_version,
        cuda_version=gpu.cuda_version,
        disks=read_disks(cache_dirs),
        hostname=socket.gethostname() or None,
        warnings=gpu.warnings + cpu.warnings,
        links=gpu.links,
    )


def hardware_file(explicit: Path | None, environ: Mapping[str, str] | None = None) -> Path | None:
    """The recorded-host file to use: the --hardware option, else $DANKSERVE_HARDWARE, else None."""
    if explicit is not None:
        return explicit
    value = (os.environ if environ is None else environ).get(HARDWARE_ENV, "")
    return Path(value) if value else None


def load_host(
    hardware: Path | None = None, cache_dirs: CacheDirs = (), environ: Mapping[str, str] | None = None
) -> Host:
    """The host every command plans for: the recorded file if one is named, else a live probe.

    `cache_dirs` may be a function so that callers pay for loading settings only when probing.
    """
    path = hardware_file(hardware, environ)
    if path is not None:
        from dankserve.host.recorded import read_host

        return read_host(path)
    dirs = cache_dirs() if callable(cache_dirs) else cache_dirs
    return probe_host(dirs)
