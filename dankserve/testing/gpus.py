"""Stand-in NVIDIA device nodes and a CDI spec naming them, for GPU passthrough without a GPU.

The nodes are real character devices (major 195 like the driver's) in a private directory;
nothing can open them, but Podman passes them into containers like real ones. The CDI spec
is written under /etc/cdi with a unique file name and declares kind nvidia.com/gpu with
device names that are unique too (`GPU-<prefix><token>-<i>`, e.g. `GPU-dankserve-test-1a2b3c4d-0`,
used as the GPUs' UUIDs): it never replaces or clashes with a real nvidia.yaml, whose devices are
named by index and by real UUID, so real GPU workloads on the host keep working meanwhile.
The tests use the prefix `dankserve-test-`, `make demo` uses `dankserve-demo-`.
"""

from __future__ import annotations

import os
import re
import stat
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from dankserve.runtime.base import GpuRef

NVIDIA_MAJOR = 195
# nvidia-uvm gets a dynamic major from the kernel; any unused one does for a stand-in.
UVM_MAJOR = 237
CONTROL_NODES = {"nvidiactl": (NVIDIA_MAJOR, 255), "nvidia-modeset": (NVIDIA_MAJOR, 254)}
UVM_NODES = {"nvidia-uvm": (UVM_MAJOR, 0), "nvidia-uvm-tools": (UVM_MAJOR, 1)}
SPEC_PREFIX = "dankserve-test-"


@dataclass(frozen=True)
class StandInGpus:
    """Stand-in GPUs: their nodes' directory (the runtime's dev_root), refs and CDI spec file."""

    dev_dir: Path
    gpus: tuple[GpuRef, ...]
    cdi_spec: Path


def make_nodes(dev_dir: Path, count: int) -> None:
    """nvidia0..count-1 plus the control and UVM nodes, as character devices in dev_dir."""
    dev_dir.mkdir(parents=True, exist_ok=True)
    nodes = {f"nvidia{i}": (NVIDIA_MAJOR, i) for i in range(count)} | CONTROL_NODES | UVM_NODES
    for name, (major, minor) in nodes.items():
        path = dev_dir / name
        if not path.exists():
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(major, minor))


def cdi_spec_text(dev_dir: Path, gpus: tuple[GpuRef, ...]) -> str:
    """A CDI spec (0.5.0: hostPath) mapping each stand-in GPU's UUID to its node at /dev/nvidiaN."""
    lines = ['cdiVersion: "0.5.0"', "kind: nvidia.com/gpu", "devices:"]
    for gpu in gpus:
        lines += [
            f"- name: {gpu.uuid}",
            "  containerEdits:",
            "    deviceNodes:",
            f"    - path: /dev/nvidia{gpu.index}",
            f"      hostPath: {dev_dir}/nvidia{gpu.index}",
        ]
    lines += ["containerEdits:", "  deviceNodes:"]
    for name in sorted(CONTROL_NODES | UVM_NODES):
        lines += [f"  - path: /dev/{name}", f"    hostPath: {dev_dir}/{name}"]
    return "\n".join(lines) + "\n"


def remove_stale_specs(cdi_dir: Path, prefix: str = SPEC_PREFIX) -> None:
    """Remove specs left by an interrupted run (their node directory is gone). A spec naming no node is not
    taken for stale: specs are written whole (`stand_in_gpus`), but one of an older dankserve may still be
    half written by a run starting beside this one (pytest-xdist's workers start together)."""
    for path in cdi_dir.glob(f"{prefix}*.yaml"):
        with suppress(OSError):
            host_paths = re.findall(r"hostPath: (\S+)", path.read_text())
            if host_paths and not any(Path(p).exists() for p in host_paths):
                path.unlink()


@contextmanager
def stand_in_gpus(
    workdir: Path, count: int = 2, cdi_dir: Path = Path("/etc/cdi"), prefix: str = SPEC_PREFIX
) -> Iterator[StandInGpus]:
    """Nodes in workdir/dev and a uniquely named CDI spec for them; both removed afterwards."""
    token = uuid.uuid4().hex[:8]
    dev_dir = workdir / "dev"
    cdi_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_specs(cdi_dir, prefix)
    gpus = tuple(GpuRef(index=i, uuid=f"GPU-{prefix}{token}-{i}") for i in range(count))
    spec = cdi_dir / f"{prefix}{token}.yaml"
    partial = cdi_dir / f".{prefix}{token}.yaml.tmp"
    try:
        make_nodes(dev_dir, count)
        # Whole or not at all: another run's `remove_stale_specs` (or Podman) reading it half written would see
        # no GPU (seen under load: a worker's spec deleted as stale by another's start, all its GPUs gone).
        partial.write_text(cdi_spec_text(dev_dir, gpus))
        partial.replace(spec)
        yield StandInGpus(dev_dir=dev_dir, gpus=gpus, cdi_spec=spec)
    finally:
        spec.unlink(missing_ok=True)
        partial.unlink(missing_ok=True)
        if dev_dir.is_dir():
            for node in dev_dir.iterdir():
                node.unlink(missing_ok=True)
            with suppress(OSError):
                dev_dir.rmdir()
