"""LoRA adapters' directories: found (a local directory, or a snapshot in the HF cache) and read.

The one reader of an adapter directory: adapter_config.json (bounded, parsed as hostile input
by `plan.lora.parse_adapter_config`) and the weight files' sizes. A Hub adapter must be in the
HF cache already (`dankserve pull` fetches it): the server reads it from there, offline.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dankserve.errors import ConfigError
from dankserve.lora_adapters import parse_source
from dankserve.plan.lora import MAX_ADAPTER_CONFIG_BYTES, AdapterConfigError, AdapterFacts, parse_adapter_config
from dankserve.plan.models import CONTAINER_HF_CACHE
from dankserve.settings import DeploymentSettings

ADAPTER_CONFIG = "adapter_config.json"
WEIGHT_SUFFIXES = (".safetensors", ".bin")
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin", "adapter_model.pt")
"""The files vLLM 0.26's LoRAModel.from_local_checkpoint loads; without one: "DIR doesn't contain tensors"."""


def adapter_dir(hf_cache_dir: Path, deployment: str, name: str, value: str) -> Path:
    """The host directory of one adapter; ConfigError (exit 2) naming it and the fix when it is missing."""
    from dankserve.hub.cache import snapshot_dir

    source = parse_source(name, value)
    if source.kind == "path":
        path = Path(source.location)
        if not path.is_dir():
            what = "a file, not a directory" if path.exists() else "no such directory"
            raise ConfigError(
                f"deployments.{deployment}.adapters.{name} = {value!r}: {what}",
                fix=f"name the directory holding the adapter's {ADAPTER_CONFIG} and weights",
            )
        return path
    found = snapshot_dir(hf_cache_dir, source.location, None, probe=ADAPTER_CONFIG)
    if found is None:
        raise ConfigError(
            f"deployments.{deployment}.adapters.{name} = {value!r}: the adapter is not in the HF cache "
            f"({hf_cache_dir})",
            fix=f"run `dankserve pull {deployment}` (it fetches the model and its adapters); for a local directory, "
            "give its absolute path (ORG/NAME is read as a Hub repo)",
        )
    return found


def read_config(path: Path, name: str, key: str | None = None) -> bytes:
    """adapter_config.json's bytes: a regular file of bounded size, read through one descriptor.

    `key` (deployments.NAME.adapters.NAME) names the config key in the error."""
    target = path / ADAPTER_CONFIG
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigError(
            f"{key or 'adapter ' + name}: cannot read {target}: {exc.strerror}",
            fix=f"point the adapter at a PEFT LoRA directory (it holds {ADAPTER_CONFIG})",
        ) from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise ConfigError(
                f"{key or 'adapter ' + name}: {target} is not a regular file", fix="replace it with the adapter's"
            )
        return handle.read(MAX_ADAPTER_CONFIG_BYTES + 1)


def weights_bytes(path: Path) -> int:
    """The adapter's weight files' total size (followed links: the HF cache links snapshots to blobs)."""
    total = 0
    for entry in path.iterdir():
        if entry.name.endswith(WEIGHT_SUFFIXES) and entry.is_file():
            total += entry.stat().st_size
    return total


def adapter_facts(hf_cache_dir: Path, deployment: str, dep: DeploymentSettings) -> tuple[AdapterFacts, ...]:
    """Every configured adapter's facts, with its path as the server sees it (container or process)."""
    from dankserve.plan.lora import container_dir

    facts: list[AdapterFacts] = []
    for name, value in dep.adapters.items():
        path = adapter_dir(hf_cache_dir, deployment, name, value)
        try:
            rank, modules = parse_adapter_config(
                name, read_config(path, name, f"deployments.{deployment}.adapters.{name}")
            )
        except AdapterConfigError as exc:
            raise ConfigError(
                f"deployments.{deployment}.adapters.{name}: {exc}",
                fix="point the adapter at a PEFT LoRA adapter vLLM can load (r, lora_alpha, target_modules)",
            ) from None
        if not any((path / weights).is_file() for weights in ADAPTER_WEIGHTS):
            raise ConfigError(
                f"deployments.{deployment}.adapters.{name} = {value!r}: no {' or '.join(ADAPTER_WEIGHTS)} in {path}"
                " (vLLM would refuse it: it doesn't contain tensors)",
                fix="point the adapter at the directory PEFT's save_pretrained wrote (adapter_config.json and"
                " adapter_model.safetensors)",
            )
        size = weights_bytes(path)
        local = parse_source(name, value).kind == "path"
        if dep.runtime == "process":
            server_path, host_dir = str(path), None
        elif local:
            server_path, host_dir = container_dir(name), str(path)
        else:
            relative = path.relative_to(hf_cache_dir)
            server_path, host_dir = f"{CONTAINER_HF_CACHE}/{relative.as_posix()}", None
        facts.append(AdapterFacts(name, server_path, rank, modules, size, host_dir))
    return tuple(facts)
