"""GPU passthrough: CDI when a spec names every assigned GPU, else the device nodes (and the control nodes)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog

from dankserve.errors import (
    GpuPassthroughUnavailable,
)
from dankserve.runtime.base import (
    GpuRef,
)

log = structlog.get_logger("dankserve.runtime.podman")


CDI_KIND_NVIDIA_GPU = "nvidia.com/gpu"


DEFAULT_CDI_DIRS: tuple[Path, ...] = (Path("/etc/cdi"), Path("/var/run/cdi"))


# Control nodes CUDA opens besides /dev/nvidiaN; passed through when the host has them.
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


@dataclass(frozen=True)
class GpuPassthrough:
    """How the assigned GPUs reach the container, and the `devices` entries that do it."""

    mode: Literal["cdi", "device-nodes", "none"]
    devices: tuple[str, ...]


def cdi_device_names(text: str, *, is_json: bool) -> frozenset[str]:
    """The device names a CDI spec declares for kind nvidia.com/gpu (empty for other kinds).

    Raises ValueError (or a yaml error) for a file that is not a CDI spec document.
    """
    if is_json:
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError("not a CDI spec: the document is not a mapping")
    if data.get("kind") != CDI_KIND_NVIDIA_GPU:
        return frozenset()
    devices = data.get("devices") or []
    if not isinstance(devices, list):
        raise ValueError("not a CDI spec: `devices` is not a list")
    return frozenset(str(d["name"]) for d in devices if isinstance(d, dict) and d.get("name") is not None)


def choose_gpu_passthrough(
    gpus: Sequence[GpuRef], cdi_names: frozenset[str], dev_nodes: frozenset[str], dev_root: Path
) -> GpuPassthrough:
    """CDI when a spec lists every assigned GPU (by UUID, else index), else the device nodes.

    Device-node mode passes /dev/nvidia<index> per GPU plus the control nodes the host has;
    an assigned GPU with neither a CDI entry nor a node is an error.
    """
    if not gpus:
        return GpuPassthrough("none", ())
    cdi: list[str] = []
    for gpu in gpus:
        name = gpu.uuid if gpu.uuid in cdi_names else str(gpu.index) if str(gpu.index) in cdi_names else None
        if name is None:
            break
        cdi.append(f"{CDI_KIND_NVIDIA_GPU}={name}")
    else:
        return GpuPassthrough("cdi", tuple(cdi))
    missing = [gpu for gpu in gpus if f"nvidia{gpu.index}" not in dev_nodes]
    if missing:
        listed = ", ".join(f"{gpu.index} ({gpu.uuid})" for gpu in missing)
        raise GpuPassthroughUnavailable(
            f"GPU {listed} has no CDI entry ({CDI_KIND_NVIDIA_GPU}=UUID or =INDEX) and no device node "
            f"{dev_root}/nvidia{missing[0].index}",
            fix="generate a CDI spec with the NVIDIA Container Toolkit "
            "(`nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`), or load the NVIDIA driver",
        )
    names = [f"nvidia{gpu.index}" for gpu in gpus] + [n for n in CONTROL_NODES if n in dev_nodes]
    return GpuPassthrough("device-nodes", tuple(f"{dev_root / n}:/dev/{n}:rwm" for n in names))


def read_cdi_device_names(dirs: Iterable[Path]) -> frozenset[str]:
    """nvidia.com/gpu device names of every CDI spec file in dirs (unreadable files are skipped)."""
    names: set[str] = set()
    for directory in dirs:
        try:
            files = sorted(directory.iterdir())
        except OSError:
            continue
        for path in files:
            if path.suffix not in (".yaml", ".yml", ".json"):
                continue
            try:
                names |= cdi_device_names(path.read_text(), is_json=path.suffix == ".json")
            except Exception as exc:  # a broken spec of another vendor must not stop the workload
                log.warning("cdi_spec_unreadable", path=str(path), error=str(exc))
    return frozenset(names)


def present_device_nodes(dev_root: Path) -> frozenset[str]:
    """Names of the nvidia* device nodes under dev_root."""
    try:
        return frozenset(name for name in os.listdir(dev_root) if name.startswith("nvidia"))
    except OSError:
        return frozenset()
