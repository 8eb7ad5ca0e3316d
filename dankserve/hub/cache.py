"""Reading a model's files from the HF cache, through huggingface_hub's own cache lookup.

A repo id is looked up with `try_to_load_from_cache` (refs/REVISION, or a cached commit);
a local path (or a path under the container's HF cache mount, mapped into `hf_cache_dir`)
is read as a directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dankserve.hub.access import is_hub_id
from dankserve.plan.models import CONTAINER_HF_CACHE, ModelFiles


def host_model_path(hf_cache_dir: Path, model: str) -> Path:
    """Where a model written as a path lives on this host: under the container's HF cache mount it maps
    into `hf_cache_dir`; any other path is taken as it is."""
    if model.startswith(CONTAINER_HF_CACHE + "/"):
        return hf_cache_dir / model.removeprefix(CONTAINER_HF_CACHE + "/")
    return Path(model)


def snapshot_dir(hf_cache_dir: Path, model: str, revision: str | None, probe: str = "config.json") -> Path | None:
    """Where a model's files live, or None when it is not cached.

    `model` is ORG/NAME, or a path: one under the container's HF cache mount maps into
    `hf_cache_dir`; another absolute path is used as it is. With no ref for the default
    revision and a single cached snapshot, that snapshot is taken. `probe`: a file every snapshot
    of the repo has (config.json for a model, adapter_config.json for a LoRA adapter).
    """
    if not is_hub_id(model):
        path = host_model_path(hf_cache_dir, model)
        return path if path.is_dir() else None
    cache = hf_cache_dir / "hub"
    if not (cache / ("models--" + model.replace("/", "--"))).is_dir():
        return None  # not cached at all: spare the import of huggingface_hub (a tenth of a second)
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(model, probe, cache_dir=cache, revision=revision)
    if isinstance(found, str):
        return Path(found).parent
    if revision is None:  # no refs/main: a snapshot copied in by hand
        snapshots = cache / ("models--" + model.replace("/", "--")) / "snapshots"
        cached = [p for p in snapshots.iterdir() if p.is_dir()] if snapshots.is_dir() else []
        if len(cached) == 1:
            return cached[0]
    return None


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, ValueError):
        return None


def read_model_files(hf_cache_dir: Path, model: str, revision: str | None) -> ModelFiles | None:
    """A cached snapshot's config, weight index and safetensors sizes (None if not cached)."""
    snapshot = snapshot_dir(hf_cache_dir, model, revision)
    if snapshot is None:
        return None
    config = _json(snapshot / "config.json")
    if not isinstance(config, dict):
        return None
    index = _json(snapshot / "model.safetensors.index.json")
    sizes = tuple(p.stat().st_size for p in sorted(snapshot.glob("*.safetensors")) if p.exists())
    return ModelFiles(snapshot, config, index if isinstance(index, dict) else None, sizes)
