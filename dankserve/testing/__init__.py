"""Helpers for dankserve's tests, benchmarks and `make demo` (and anyone testing against it).

Recorded hosts live in the source tree under `dankserve/testing/hosts/NAME.json`: typical GPU machines
(RTX 3090/4090, A100 40/80 GB, H100, H200; 1 to 8 GPUs; 1 and 2 NUMA nodes) in the
`dankserve probe --save` format, so planner tests need no GPU. Submodules: `podman_service`
(a private Podman service), `gpus` (stand-in GPU device nodes and a CDI spec), `config_file`
(a dankserve.toml from plain values).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from dankserve.host.model import Host

HOSTS_DIR = Path(__file__).resolve().parent / "hosts"
"""The recorded hosts (package data: an installed dankserve has them too; nothing here reads `tests/`)."""


def recorded_host_names() -> list[str]:
    """The names of the recorded hosts shipped with the package, sorted."""
    return sorted(path.stem for path in HOSTS_DIR.glob("*.json"))


def recorded_host_path(name: str) -> Path:
    """The file of a recorded host, by name with or without '.json' (e.g. 'h100x4-2numa')."""
    path = HOSTS_DIR / (name if name.endswith(".json") else f"{name}.json")
    if not path.is_file():
        known = ", ".join(recorded_host_names()) or f"none: {HOSTS_DIR} is absent (a broken install?)"
        raise FileNotFoundError(f"no recorded host {name!r}; known: {known}")
    return path


def recorded_host(name: str) -> Host:
    """A recorded host, read through the same code as `--hardware FILE`."""
    from dankserve.host.recorded import read_host

    return read_host(recorded_host_path(name))


def write_recorded_host(
    path: Path, base: str = "h200x2-vm-real", uuids: Sequence[str] | None = None, free_fraction: float = 0.996
) -> Path:
    """A copy of a recorded host with its GPUs' UUIDs replaced (e.g. by stand-in GPUs') and the
    free memory set to a fraction of the total (what boot learning reads as the baseline)."""
    data = json.loads(recorded_host_path(base).read_text())
    for i, gpu in enumerate(data["gpus"]):
        if uuids is not None:
            gpu["uuid"] = uuids[i]
        gpu["memory_free_bytes"] = int(gpu["memory_total_bytes"] * free_fraction)
    path.write_text(json.dumps(data))
    return path
