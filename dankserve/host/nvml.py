"""GPUs through NVML (nvidia-ml-py), split into raw readings (I/O) and their interpretation (pure).

`read_nvml()` is the only part that talks to the driver: it initialises NVML, reads every
device into `RawGpu` records, and always shuts NVML down. `gpus_from_readings()` turns those
records into `Gpu` objects: PCI bus order, NVML-form bus ids, the NUMA node choice. Tests feed
recorded readings to the pure part; the I/O part is tested against the real driver (`gpu` mark).

Links between GPUs: NVML's NVLink readings give, per active link, the remote end's type and
PCI bus id. A link whose remote end is the other GPU counts directly; on NVSwitch systems
(HGX H100/H200, DGX A100) every link ends at a switch, whose bus id NVML reports as
FFFFFFFF:FF:FF.0 inside a VM, so two GPUs that both have switch links and whose NVLink P2P
status is OK count as NVLink with the fewer of their switch links (nvidia-smi's NV18 on an
H200 VM). Other pairs get the PCIe path from `nvmlDeviceGetTopologyCommonAncestor`. Links are
optional: an error reading them is a warning, never a failed probe.

GPU order: NVML's own index order is not promised to be stable or to follow the PCI bus, while
CUDA with `CUDA_DEVICE_ORDER=PCI_BUS_ID` (which the planner sets) numbers devices by PCI bus
id. So GPUs are sorted by bus id and `Gpu.index` is the position in that order; a host where
NVML's order differs gets a warning, since `nvidia-smi` then numbers the GPUs differently.
"""

from __future__ import annotations

import glob
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dankserve.errors import NvmlUnavailable
from dankserve.host.model import Gpu, GpuLink, LinkKind, nvml_bus_id, pci_address, sysfs_bus_id

NVML_LIBRARY = "libnvidia-ml.so.1"
DEVICE_NODES = "/dev/nvidia*"
SYSFS_ROOT = Path("/sys")


# nvmlNvLinkDeviceType_t and nvmlGpuTopologyLevel_t values (nvml.h), kept here so the pure part needs no pynvml
NVLINK_REMOTE_GPU = 0
NVLINK_REMOTE_SWITCH = 2
P2P_STATUS_OK = 0
TOPOLOGY_KINDS: dict[int, LinkKind] = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
"""INTERNAL (one board), SINGLE -> PIX; MULTIPLE -> PXB; HOSTBRIDGE -> PHB; NODE -> NODE; SYSTEM -> SYS."""


@dataclass(frozen=True)
class RawNvLink:
    """One active NVLink of a device: what NVML says is at its other end (None: NVML would not say)."""

    remote_type: int | None
    """nvmlDeviceGetNvLinkRemoteDeviceType: 0 GPU, 1 IBM NPU, 2 NVSwitch, 255 unknown."""
    remote_bus_id: str | None


@dataclass(frozen=True)
class RawPair:
    """What NVML says about two devices (by NVML index) together."""

    nvml_a: int
    nvml_b: int
    common_ancestor: int | None
    """nvmlDeviceGetTopologyCommonAncestor (nvmlGpuTopologyLevel_t); None when NVML would not say."""
    p2p_nvlink: int | None
    """nvmlDeviceGetP2PStatus(.., NVML_P2P_CAPS_INDEX_NVLINK): 0 OK; None when NVML would not say."""


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
    nvlinks: tuple[RawNvLink, ...] = ()
    """The device's active NVLinks (none on PCIe-only GPUs)."""


@dataclass(frozen=True)
class NvmlReadings:
    """Everything read from NVML in one session."""

    driver_version: str
    cuda_driver_version: int | None
    """nvmlSystemGetCudaDriverVersion_v2, e.g. 13000 for CUDA 13.0."""
    gpus: tuple[RawGpu, ...]
    skipped: tuple[str, ...] = ()
    """Devices NVML counted but would not open (e.g. no permission), one description each."""
    pairs: tuple[RawPair, ...] | None = None
    """Every pair of opened devices; None when the links could not be read (see link_problem)."""
    link_problem: str | None = None


@dataclass(frozen=True)
class GpuFacts:
    """The interpreted NVML readings: GPUs in PCI bus order plus driver-wide facts."""

    gpus: tuple[Gpu, ...]
    driver_version: str
    cuda_version: str | None
    warnings: tuple[str, ...]
    links: tuple[GpuLink, ...] | None = None


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
    if readings.link_problem is not None:
        warnings.append(f"links between GPUs not recorded: {readings.link_problem}")
    return GpuFacts(
        gpus=gpus,
        driver_version=readings.driver_version,
        cuda_version=cuda_version_string(readings.cuda_driver_version),
        warnings=tuple(warnings),
        links=links_from_readings(readings),
    )


def links_from_readings(readings: NvmlReadings) -> tuple[GpuLink, ...] | None:
    """Each GPU pair's connection, GPUs indexed in PCI bus order; None when the links were not read.

    A pair NVML gives neither NVLinks nor a PCIe path for is left out (unknown).
    """
    if readings.pairs is None:
        return None
    ordered = sorted(readings.gpus, key=lambda raw: pci_address(raw.pci_bus_id))
    position = {raw.nvml_index: index for index, raw in enumerate(ordered)}
    by_nvml = {raw.nvml_index: raw for raw in ordered}
    links: list[GpuLink] = []
    for pair in readings.pairs:
        if pair.nvml_a not in position or pair.nvml_b not in position or pair.nvml_a == pair.nvml_b:
            continue
        first, second = sorted((by_nvml[pair.nvml_a], by_nvml[pair.nvml_b]), key=lambda raw: position[raw.nvml_index])
        link = pair_link(first, second, pair)
        if link is not None:
            links.append(GpuLink(a=position[first.nvml_index], b=position[second.nvml_index], **link))
    return tuple(sorted(links, key=lambda link: (link.a, link.b)))


def pair_link(first: RawGpu, second: RawGpu, pair: RawPair) -> dict[str, Any] | None:
    """Kind and NVLink count of one pair: direct NVLinks, else NVLinks through NVSwitches, else the PCIe path."""
    direct = max(_links_to(first, second), _links_to(second, first))
    if direct:
        return {"kind": "NVLINK", "nvlinks": direct}
    switched = min(_switch_links(first), _switch_links(second))
    if switched and pair.p2p_nvlink in (None, P2P_STATUS_OK):
        return {"kind": "NVLINK", "nvlinks": switched}
    kind = TOPOLOGY_KINDS.get(pair.common_ancestor) if pair.common_ancestor is not None else None
    return None if kind is None else {"kind": kind, "nvlinks": None}


def _links_to(device: RawGpu, peer: RawGpu) -> int:
    target = _bus_key(peer.pci_bus_id)
    return sum(
        1
        for link in device.nvlinks
        if link.remote_type in (None, NVLINK_REMOTE_GPU)
        and link.remote_bus_id
        and _bus_key(link.remote_bus_id) == target
    )


def _switch_links(device: RawGpu) -> int:
    return sum(1 for link in device.nvlinks if link.remote_type == NVLINK_REMOTE_SWITCH)


def _bus_key(bus_id: str) -> tuple[int, int, int, int] | None:
    try:
        return pci_address(bus_id)
    except ValueError:
        return None


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
    handles: dict[int, Any] = {}
    skipped: list[str] = []
    for index in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except (nvml.NVMLError_NoPermission, nvml.NVMLError_GpuIsLost, nvml.NVMLError_Unknown) as exc:
            skipped.append(f"GPU {index} (NVML index) skipped: NVML could not open it ({exc})")
            continue
        handles[index] = handle
        gpus.append(_read_device(nvml, index, handle, sysfs_root))
    if not gpus:
        what = "NVML sees no GPU" if count == 0 else f"NVML could open none of its {count} GPUs"
        raise nvml_unavailable(what, sorted(glob.glob(DEVICE_NODES)))
    pairs: tuple[RawPair, ...] | None = None
    link_problem: str | None = None
    try:
        gpus = [replace(gpu, nvlinks=read_nvlinks(nvml, handles[gpu.nvml_index])) for gpu in gpus]
        pairs = read_pairs(nvml, handles)
    except (nvml.NVMLError, AttributeError, TypeError, ValueError) as exc:
        # links only guide the planner's GPU choice: never fail a probe over them
        link_problem = f"NVML failed while reading them ({type(exc).__name__}: {exc})"
    return NvmlReadings(
        driver_version=_text(nvml.nvmlSystemGetDriverVersion()),
        cuda_driver_version=_cuda_driver_version(nvml),
        gpus=tuple(gpus),
        skipped=tuple(skipped),
        pairs=pairs,
        link_problem=link_problem,
    )


def read_nvlinks(nvml: Any, handle: Any) -> tuple[RawNvLink, ...]:
    """The device's active NVLinks; links NVML reports as absent or unsupported (PCIe GPUs) are skipped."""
    # nvidia-ml-py 13 names only the unsuffixed call (which uses NVML's _v2 underneath)
    remote_pci = (
        "nvmlDeviceGetNvLinkRemotePciInfo_v2"
        if hasattr(nvml, "nvmlDeviceGetNvLinkRemotePciInfo_v2")
        else "nvmlDeviceGetNvLinkRemotePciInfo"
    )
    found: list[RawNvLink] = []
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            active = nvml.nvmlDeviceGetNvLinkState(handle, link) == 1
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
            continue  # no NVLink (PCIe GPUs), or past this GPU's links (18 on an H200); other errors: a warning
        if active:
            remote_type = _optional_call(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
            remote = _optional_call(nvml, remote_pci, handle, link)
            bus_id = None if remote is None else _text(remote.busId)
            found.append(RawNvLink(None if remote_type is None else int(remote_type), bus_id))
    return tuple(found)


def read_pairs(nvml: Any, handles: dict[int, Any]) -> tuple[RawPair, ...]:
    """The PCIe common ancestor and NVLink P2P status of every pair of opened devices."""
    nvlink_caps = getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", 3)
    indices = sorted(handles)
    pairs: list[RawPair] = []
    for position, a in enumerate(indices):
        for b in indices[position + 1 :]:
            ancestor = _optional_call(nvml, "nvmlDeviceGetTopologyCommonAncestor", handles[a], handles[b])
            p2p = _optional_call(nvml, "nvmlDeviceGetP2PStatus", handles[a], handles[b], nvlink_caps)
            pairs.append(RawPair(a, b, None if ancestor is None else int(ancestor), None if p2p is None else int(p2p)))
    return tuple(pairs)


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


def _optional_call(nvml: Any, name: str, *args: Any) -> Any:
    # as _optional: a call this binding lacks, or a reading NVML does not support, is unknown, not a failure
    function = getattr(nvml, name, None)
    if function is None:
        return None
    try:
        return function(*args)
    except nvml.NVMLError:
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
