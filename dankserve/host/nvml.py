"""GPUs through NVML (nvidia-ml-py), split into raw readings (I/O) and their interpretation (pure).

`read_nvml()` is the only part that talks to the driver: it initialises NVML, reads every
device into `RawGpu` records, and always shuts NVML down. `gpus_from_readings()` turns those
records into `Gpu` objects: PCI bus order, NVML-form bus ids, the NUMA node choice. Tests feed
recorded readings to the pure part; the I/O part is tested against the real driver (`gpu` mark).

GPU order: NVML's own index order is not promised to be stable or to follow the PCI bus, while
CUDA with `CUDA_DEVICE_ORDER=PCI_BUS_ID` (which the planner sets) numbers devices by PCI bus
id. So GPUs are sorted by bus id and `Gpu.index` is the position in that order; a host where
NVML's order differs gets a warning, since `nvidia-smi` then numbers the GPUs differently.
"""

from __future__ import annotations

import glob
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dankserve.errors import NvmlUnavailable
from dankserve.host.model import Gpu, nvml_bus_id, pci_address, sysfs_bus_id

NVML_LIBRARY = "libnvidia-ml.so.1"
DEVICE_NODES = "/dev/nvidia*"
SYSFS_ROOT = Path("/sys")


@dataclass(frozen=True)
class RawGpu:
    """What NVML (and sysfs) said about one device, before interpretation."""

    nvml_index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_free_bytes: int
    compute_capability: tuple[int, int]
    pci_bus_id: str
    nvml_numa_node: int | None
    """nvmlDeviceGetNumaNodeId; None when NVML does not support it (it is meant for GPUs that are NUMA nodes)."""
    sysfs_numa_node: int | None
    """/sys/bus/pci/devices/<bus id>/numa_node; None when absent or -1."""
    mig_current_mode: int | None
    """nvmlDeviceGetMigMode's current mode (1 enabled); None when MIG is unsupported."""


@dataclass(frozen=True)
class NvmlReadings:
    """Everything read from NVML in one session."""

    driver_version: str
    cuda_driver_version: int | None
    """nvmlSystemGetCudaDriverVersion_v2, e.g. 13000 for CUDA 13.0."""
    gpus: tuple[RawGpu, ...]
    skipped: tuple[str, ...] = ()
    """Devices NVML counted but would not open (e.g. no permission), one description each."""


@dataclass(frozen=True)
class GpuFacts:
    """The interpreted NVML readings: GPUs in PCI bus order plus driver-wide facts."""

    gpus: tuple[Gpu, ...]
    driver_version: str
    cuda_version: str | None
    warnings: tuple[str, ...]


# ---- pure part --------------------------------------------------------------------------


def cuda_version_string(version: int | None) -> str | None:
    """NVML's integer CUDA driver version as major.minor: 13000 -> '13.0', 12040 -> '12.4'."""
    if version is None or version <= 0:
        return None
    return f"{version // 1000}.{(version % 1000) // 10}"


def numa_node_of(nvml_node: int | None, sysfs_node: int | None, cpu_nodes: Collection[int] | None) -> int | None:
    """The NUMA node nearest a GPU: NVML's answer if it names a node with CPUs, else sysfs's, else None.

    NVML's value is the GPU's own memory node on coherent platforms (Grace Hopper), which may
    have no CPUs; for CPU binding the PCI device's node from sysfs is the right one there.
    `cpu_nodes` (nodes that have CPUs) is None when the host's NUMA layout is unknown.
    """
    if nvml_node is not None and nvml_node >= 0 and (cpu_nodes is None or nvml_node in cpu_nodes):
        return nvml_node
    if sysfs_node is not None and sysfs_node >= 0:
        return sysfs_node
    return None


def gpus_from_readings(readings: NvmlReadings, cpu_nodes: Collection[int] | None = None) -> GpuFacts:
    """GPUs sorted by PCI bus id and numbered in that order, with warnings for what looks odd."""
    ordered = sorted(readings.gpus, key=lambda raw: pci_address(raw.pci_bus_id))
    warnings = list(readings.skipped)
    nvml_order = [raw.nvml_index for raw in ordered]
    if nvml_order != sorted(nvml_order):
        warnings.append(
            f"NVML numbers the GPUs {nvml_order} in PCI bus order; dankserve uses PCI bus order "
            "(CUDA_DEVICE_ORDER=PCI_BUS_ID), so its indices differ from nvidia-smi's"
        )
    gpus = tuple(
        Gpu(
            index=position,
            uuid=raw.uuid,
            name=raw.name,
            memory_total_bytes=raw.memory_total_bytes,
            memory_free_bytes=raw.memory_free_bytes,
            compute_capability=raw.compute_capability,
            numa_node=numa_node_of(raw.nvml_numa_node, raw.sysfs_numa_node, cpu_nodes),
            pci_bus_id=nvml_bus_id(raw.pci_bus_id),
            mig_mode=None if raw.mig_current_mode is None else raw.mig_current_mode == 1,
        )
        for position, raw in enumerate(ordered)
    )
    return GpuFacts(
        gpus=gpus,
        driver_version=readings.driver_version,
        cuda_version=cuda_version_string(readings.cuda_driver_version),
        warnings=tuple(warnings),
    )


def nvml_unavailable(reason: str, device_nodes: Sequence[str]) -> NvmlUnavailable:
    """The error for a host where NVML cannot be used, naming what was looked for and found."""
    found = ", ".join(device_nodes) if device_nodes else "none"
    return NvmlUnavailable(
        f"no usable NVIDIA GPU: {reason}. Looked for the NVML library {NVML_LIBRARY} "
        f"and the device nodes {DEVICE_NODES} (found: {found})",
        fix="install the NVIDIA driver (in a container: expose the GPUs and the driver libraries), "
        "or pass --hardware FILE (or DANKSERVE_HARDWARE) to use a recorded host",
    )


# ---- I/O part ---------------------------------------------------------------------------


def sysfs_numa_node(bus_id: str, sysfs_root: Path = SYSFS_ROOT) -> int | None:
    """The PCI device's NUMA node from sysfs; None when the file is absent, unreadable or -1."""
    path = sysfs_root / "bus" / "pci" / "devices" / sysfs_bus_id(bus_id) / "numa_node"
    try:
        node = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def read_nvml(sysfs_root: Path = SYSFS_ROOT) -> NvmlReadings:
    """Read every GPU through NVML; NvmlUnavailable (exit 3) when NVML or the GPUs cannot be used."""
    try:
        import pynvml
    except ImportError:
        raise nvml_unavailable(
            "the Python package nvidia-ml-py (module pynvml) is not installed", sorted(glob.glob(DEVICE_NODES))
        ) from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise nvml_unavailable(f"NVML could not be initialised ({exc})", sorted(glob.glob(DEVICE_NODES))) from None
    try:
        return read_devices(pynvml, sysfs_root)
    except pynvml.NVMLError as exc:
        raise nvml_unavailable(f"NVML failed while reading the GPUs ({exc})", sorted(glob.glob(DEVICE_NODES))) from None
    finally:
        pynvml.nvmlShutdown()


def read_devices(nvml: Any, sysfs_root: Path = SYSFS_ROOT) -> NvmlReadings:
    """Read every device through an initialised NVML binding (the pynvml module, or a stand-in in tests)."""
    count = nvml.nvmlDeviceGetCount()
    gpus: list[RawGpu] = []
    skipped: list[str] = []
    for index in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except (nvml.NVMLError_NoPermission, nvml.NVMLError_GpuIsLost, nvml.NVMLError_Unknown) as exc:
            skipped.append(f"GPU {index} (NVML index) skipped: NVML could not open it ({exc})")
            continue
        gpus.append(_read_device(nvml, index, handle, sysfs_root))
    if not gpus:
        what = "NVML sees no GPU" if count == 0 else f"NVML could open none of its {count} GPUs"
        raise nvml_unavailable(what, sorted(glob.glob(DEVICE_NODES)))
    return NvmlReadings(
        driver_version=_text(nvml.nvmlSystemGetDriverVersion()),
        cuda_driver_version=_cuda_driver_version(nvml),
        gpus=tuple(gpus),
        skipped=tuple(skipped),
    )


def _read_device(nvml: Any, index: int, handle: Any, sysfs_root: Path) -> RawGpu:
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
    major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    return RawGpu(
        nvml_index=index,
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        name=_text(nvml.nvmlDeviceGetName(handle)),
        memory_total_bytes=int(memory.total),
        memory_free_bytes=int(memory.free),
        compute_capability=(int(major), int(minor)),
        pci_bus_id=bus_id,
        nvml_numa_node=_optional(nvml, lambda: int(nvml.nvmlDeviceGetNumaNodeId(handle))),
        sysfs_numa_node=sysfs_numa_node(bus_id, sysfs_root),
        mig_current_mode=_optional(nvml, lambda: int(nvml.nvmlDeviceGetMigMode(handle)[0])),
    )


def _cuda_driver_version(nvml: Any) -> int | None:
    v2 = _optional(nvml, lambda: int(nvml.nvmlSystemGetCudaDriverVersion_v2()))
    if v2 is not None:
        return v2
    return _optional(nvml, lambda: int(nvml.nvmlSystemGetCudaDriverVersion()))


def _optional(nvml: Any, read: Callable[[], int]) -> int | None:
    # Not Supported / Function Not Found (old drivers) / N/A readings are "unknown", not failures
    try:
        return read()
    except (nvml.NVMLError, AttributeError):
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
