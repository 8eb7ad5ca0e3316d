"""The host description: plain frozen data, and the recorded-host JSON schema (version 1).

`dankserve probe --json` prints it, `--save FILE` writes it and `--hardware FILE` reads it
back, so a host recorded on a GPU machine can drive the planner anywhere. Unknown fields are
ignored and missing optional ones are null, so older and newer files both load.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION: Literal[1] = 1


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Gpu(_Record):
    """One NVIDIA GPU as NVML reports it."""

    index: int = Field(ge=0, description="NVML index (PCI bus order with CUDA_DEVICE_ORDER=PCI_BUS_ID).")
    uuid: str
    name: str
    memory_total_bytes: int = Field(gt=0)
    memory_free_bytes: int | None = Field(default=None, ge=0)
    compute_capability: tuple[int, int]
    numa_node: int | None = Field(default=None, description="Nearest NUMA node; null when unknown.")
    pci_bus_id: str | None = Field(default=None, description="NVML form, e.g. 00000000:17:00.0.")
    mig_mode: bool | None = Field(default=None, description="MIG enabled; null when unsupported or unknown.")


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

    def gpu(self, ref: int | str) -> Gpu | None:
        """The GPU with this index or UUID."""
        for gpu in self.gpus:
            if (isinstance(ref, int) and gpu.index == ref) or gpu.uuid == str(ref) or str(gpu.index) == str(ref):
                return gpu
        return None
