"""The host description: plain frozen data, and the recorded-host JSON schema (version 1).

`dankserve probe --json` prints it, `--save FILE` writes it and `--hardware FILE` reads it
back, so a host recorded on a GPU machine can drive the planner anywhere. Unknown fields are
ignored and missing optional ones are null, so older and newer files both load.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

SCHEMA_VERSION: Literal[1] = 1

_PCI_BUS_ID = re.compile(r"^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


def pci_address(bus_id: str) -> tuple[int, int, int, int]:
    """(domain, bus, device, function) of a PCI bus id in NVML (00000000:17:00.0) or sysfs (0000:17:00.0) form."""
    match = _PCI_BUS_ID.match(bus_id.strip())
    if match is None:
        raise ValueError(f"{bus_id!r} is not a PCI bus id like 00000000:17:00.0")
    domain, bus, device, function = (int(part, 16) for part in match.groups())
    return domain, bus, device, function


def nvml_bus_id(bus_id: str) -> str:
    """The bus id in NVML's form: 8-digit domain, upper-case hex (00000000:17:00.0)."""
    domain, bus, device, function = pci_address(bus_id)
    return f"{domain:08X}:{bus:02X}:{device:02X}.{function:X}"


def sysfs_bus_id(bus_id: str) -> str:
    """The bus id as Linux names it under /sys/bus/pci/devices: lower case, 4-digit domain (0000:17:00.0)."""
    domain, bus, device, function = pci_address(bus_id)
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Gpu(_Record):
    """One NVIDIA GPU as NVML reports it."""

    index: int = Field(ge=0, description="Position in PCI bus order (= CUDA index with CUDA_DEVICE_ORDER=PCI_BUS_ID).")
    uuid: str
    name: str
    memory_total_bytes: int = Field(gt=0)
    memory_free_bytes: int | None = Field(default=None, ge=0)
    compute_capability: tuple[int, int]
    numa_node: int | None = Field(default=None, description="Nearest NUMA node; null when unknown.")
    pci_bus_id: str | None = Field(default=None, description="NVML form, e.g. 00000000:17:00.0.")
    mig_mode: bool | None = Field(default=None, description="MIG enabled; null when unsupported or unknown.")

    @field_validator("pci_bus_id")
    @classmethod
    def _nvml_form(cls, value: str | None) -> str | None:
        # files written by hand may use the sysfs form; keep one spelling
        return None if value is None else nvml_bus_id(value)


class Cpu(_Record):
    physical_cores: int = Field(ge=1)
    logical_cores: int = Field(ge=1)


class Memory(_Record):
    total_bytes: int = Field(ge=0)
    available_bytes: int | None = Field(default=None, ge=0)
    swap_total_bytes: int | None = Field(default=None, ge=0)


class NumaNode(_Record):
    id: int = Field(ge=0)
    cpus: tuple[int, ...] = ()
    memory_total_bytes: int | None = Field(default=None, ge=0)


class Disk(_Record):
    """Free space where a cache directory lives."""

    path: str
    free_bytes: int = Field(ge=0)
    total_bytes: int | None = Field(default=None, ge=0)


LinkKind = Literal["NVLINK", "PIX", "PXB", "PHB", "NODE", "SYS"]
"""How two GPUs reach each other, in nvidia-smi topo's words: NVLink, else the PCIe path (best to worst)."""

LINK_KINDS: tuple[LinkKind, ...] = ("NVLINK", "PIX", "PXB", "PHB", "NODE", "SYS")


class GpuLink(_Record):
    """The connection between two GPUs (by index, a < b)."""

    a: int = Field(ge=0)
    b: int = Field(ge=0)
    kind: LinkKind
    nvlinks: int | None = Field(default=None, ge=1, description="Active NVLinks between them (nvidia-smi's NV#).")

    @model_validator(mode="after")
    def _ordered(self) -> GpuLink:
        if self.a >= self.b:
            raise ValueError(f"a link names its GPUs in order (a < b), found a={self.a}, b={self.b}")
        if self.kind != "NVLINK" and self.nvlinks is not None:
            raise ValueError(f"a {self.kind} link has no NVLinks (nvlinks = {self.nvlinks})")
        return self

    def label(self) -> str:
        """nvidia-smi topo's cell: NV18, or the PCIe path's name."""
        if self.kind == "NVLINK":
            return f"NV{self.nvlinks}" if self.nvlinks is not None else "NV?"
        return self.kind


class Host(_Record):
    """Everything the planner needs to know about a machine."""

    schema_version: Literal[1] = SCHEMA_VERSION
    gpus: tuple[Gpu, ...] = ()
    cpu: Cpu
    memory: Memory
    numa_nodes: tuple[NumaNode, ...] = ()
    driver_version: str | None = None
    cuda_version: str | None = None
    disks: tuple[Disk, ...] = ()
    hostname: str | None = None
    warnings: tuple[str, ...] = Field(default=(), description="What the probe could not read exactly.")
    links: tuple[GpuLink, ...] | None = Field(
        default=None, description="How each GPU pair is connected; null when not recorded (older files) or unreadable."
    )

    @field_validator("gpus")
    @classmethod
    def _gpus_distinct(cls, value: tuple[Gpu, ...]) -> tuple[Gpu, ...]:
        # deployments name GPUs by index or UUID: each must pick exactly one
        for attr in ("index", "uuid"):
            seen = [getattr(gpu, attr) for gpu in value]
            twice = sorted({str(v) for v in seen if seen.count(v) > 1})
            if twice:
                raise ValueError(f"two GPUs share the {attr} {', '.join(twice)}")
        return value

    @field_validator("links")
    @classmethod
    def _links_name_gpus(cls, value: tuple[GpuLink, ...] | None, info: ValidationInfo) -> tuple[GpuLink, ...] | None:
        if value is None:
            return None
        indices = {gpu.index for gpu in info.data.get("gpus", ())}
        seen: set[tuple[int, int]] = set()
        for link in value:
            pair = (link.a, link.b)
            if not {link.a, link.b} <= indices:
                raise ValueError(f"the link {link.a}-{link.b} names a GPU index the host lacks ({sorted(indices)})")
            if pair in seen:
                raise ValueError(f"the link {link.a}-{link.b} appears twice")
            seen.add(pair)
        return value

    def link(self, a: int, b: int) -> GpuLink | None:
        """The recorded connection between GPUs `a` and `b` (either order); None when unknown."""
        low, high = min(a, b), max(a, b)
        return next((link for link in self.links or () if (link.a, link.b) == (low, high)), None)

    def gpu(self, ref: int | str) -> Gpu | None:
        """The GPU with this index or UUID."""
        for gpu in self.gpus:
            if (isinstance(ref, int) and gpu.index == ref) or gpu.uuid == str(ref) or str(gpu.index) == str(ref):
                return gpu
        return None


@dataclass(frozen=True)
class GpuIdentity:
    """What of a GPU decides the KV bytes learned on it: its model and its total memory (this host's or a
    follower's: the boot fingerprint of supervisor.learning, the per-host learning of cluster)."""

    name: str
    memory_total_bytes: int
