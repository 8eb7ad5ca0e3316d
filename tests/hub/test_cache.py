"""Tests for dankserve.hub.cache: the HF cache layout read through huggingface_hub."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dankserve.hub.cache import read_model_files, snapshot_dir
from dankserve.plan.models import model_facts
from dankserve.settings import ModelFactsSettings
from tests.plan.test_models import QWEN3_MOE_CONFIG


def _cache(tmp_path: Path, model: str, commit: str, *, ref: str | None = "main", index: bool = True) -> Path:
    repo = tmp_path / "hub" / ("models--" + model.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(QWEN3_MOE_CONFIG))
    blobs = repo / "blobs"
    blobs.mkdir()
    for i, size in enumerate((1000, 2000)):
        blob = blobs / f"blob{i}"
        blob.write_bytes(b"\0" * size)
        (snapshot / f"model-0000{i + 1}-of-00002.safetensors").symlink_to(blob)
    if index:
        (snapshot / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 61_000}}))
    if ref is not None:
        (repo / "refs").mkdir()
        (repo / "refs" / ref).write_text(commit)  # as huggingface_hub writes it: no newline
    return snapshot


def test_reads_the_snapshot_named_by_refs_main(tmp_path: Path) -> None:
    """ORG/NAME maps to hub/models--ORG--NAME; refs/main names the snapshot; the index gives the size."""
    _cache(tmp_path, "Qwen/Qwen3-30B-A3B", "abc123")
    files = read_model_files(tmp_path, "Qwen/Qwen3-30B-A3B", None)
    assert files is not None and files.snapshot.name == "abc123"
    facts = model_facts("Qwen/Qwen3-30B-A3B", None, files)
    assert facts.parameter_bytes == 61_000
    assert facts.num_key_value_heads == 4
    assert facts.source == "HF cache snapshot abc123"


def test_sums_safetensors_through_symlinks_without_index(tmp_path: Path) -> None:
    """Without an index the weight size is the sum of the safetensors files (blob sizes, via symlinks)."""
    _cache(tmp_path, "org/small", "c0ffee", index=False)
    facts = model_facts("org/small", None, read_model_files(tmp_path, "org/small", None))
    assert facts.parameter_bytes == 3000


@pytest.mark.parametrize(
    ("revision", "ref", "found"),
    [
        ("v1.0", "v1.0", True),  # a tag or branch: refs/NAME
        ("deadbeef", None, True),  # a commit: the snapshot directory itself
        ("other", "main", False),  # a revision that is not cached
        (None, None, True),  # no refs/main but one snapshot: that one
    ],
)
def test_revision_selects_the_snapshot(tmp_path: Path, revision: str | None, ref: str | None, found: bool) -> None:
    """The configured revision (a ref or a commit) picks the snapshot; an uncached one is not guessed."""
    _cache(tmp_path, "org/m", "deadbeef", ref=ref)
    assert (snapshot_dir(tmp_path, "org/m", revision) is not None) is found


def test_container_paths_map_into_the_hf_cache(tmp_path: Path) -> None:
    """A model given as a path under the container's HF mount is read from hf_cache_dir."""
    snapshot = _cache(tmp_path, "org/m", "abc")
    container_path = "/root/.cache/huggingface/" + str(snapshot.relative_to(tmp_path))
    assert snapshot_dir(tmp_path, container_path, None) == snapshot


def test_uncached_model_uses_declared_facts(tmp_path: Path) -> None:
    """A model absent from the cache takes the facts declared in the config."""
    declared = ModelFactsSettings(parameter_bytes=123, num_attention_heads=8, head_dim=64)
    facts = model_facts("org/absent", declared, read_model_files(tmp_path, "org/absent", None))
    assert (facts.parameter_bytes, facts.num_attention_heads, facts.source) == (123, 8, "declared in config")
    assert "num_key_value_heads" in facts.missing
