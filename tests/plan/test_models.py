"""Tests for dankserve.plan.models: HF config parsing, weight sizes, the cache layout, merging."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dankserve.plan.models import (
    ModelFacts,
    kv_element_bytes,
    merge_facts,
    model_facts,
    parse_config,
    read_model_files,
    snapshot_dir,
    weights_bytes,
)
from dankserve.settings import ModelFacts as DeclaredModelFacts

QWEN3_MOE_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 2048,
    "head_dim": 128,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "num_hidden_layers": 48,
    "max_position_embeddings": 40960,
    "num_experts": 128,
    "sliding_window": None,
    "use_sliding_window": False,
    "torch_dtype": "bfloat16",
}
LLAMA_CONFIG = {
    "hidden_size": 8192,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "num_hidden_layers": 80,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            QWEN3_MOE_CONFIG,
            {
                "num_attention_heads": 32,
                "num_key_value_heads": 4,
                "num_hidden_layers": 48,
                "head_dim": 128,
                "max_position_embeddings": 40960,
                "moe": True,
                "num_experts": 128,
                "dtype_bytes": 2,
                "kv_layout_standard": True,
            },
        ),
        (
            LLAMA_CONFIG,  # no head_dim: hidden_size / heads
            {"head_dim": 128, "moe": False, "num_experts": None, "quantization": None},
        ),
        (
            {"hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32},  # MHA: kv heads = heads
            {"num_key_value_heads": 32, "head_dim": 128, "dtype_bytes": None},
        ),
        (
            {"text_config": {**LLAMA_CONFIG, "num_local_experts": 16}, "torch_dtype": "bfloat16"},
            {"num_attention_heads": 64, "moe": True, "num_experts": 16, "dtype_bytes": 2},
        ),
        (
            {**QWEN3_MOE_CONFIG, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}},
            {"quantization": "fp8"},
        ),
        (
            {**LLAMA_CONFIG, "kv_lora_rank": 512, "n_routed_experts": 256},
            {"kv_layout_standard": False, "num_experts": 256},
        ),
        (
            {**LLAMA_CONFIG, "layer_types": ["linear_attention", "linear_attention", "full_attention"]},
            {"kv_layout_standard": False},
        ),
        ({**LLAMA_CONFIG, "sliding_window": 4096}, {"kv_layout_standard": False}),
        ({**LLAMA_CONFIG, "sliding_window": 32768, "use_sliding_window": False}, {"kv_layout_standard": True}),
    ],
)
def test_parse_config(config: dict[str, Any], expected: dict[str, Any]) -> None:
    """config.json fields become facts: heads, KV heads, layers, head size, context, MoE, quantisation, layout."""
    facts = parse_config("org/model", config)
    for name, value in expected.items():
        assert getattr(facts, name) == value, name


@pytest.mark.parametrize(
    ("index", "sizes", "expected"),
    [
        ({"metadata": {"total_size": 61_064_000_000}}, (1, 2), 61_064_000_000),
        ({"metadata": {}}, (100, 200), 300),
        (None, (5_000_000_000, 4_000_000_000), 9_000_000_000),
        (None, (), None),
    ],
)
def test_weights_bytes(index: dict[str, Any] | None, sizes: tuple[int, ...], expected: int | None) -> None:
    """The index's metadata.total_size wins; else the safetensors sizes add up; else unknown."""
    assert weights_bytes(index, sizes) == expected


def test_kv_bytes_per_token_replicates_heads_beyond_tp() -> None:
    """Per-GPU KV per token halves with each TP doubling until TP exceeds the KV heads, then stays."""
    facts = parse_config("m", QWEN3_MOE_CONFIG)  # 4 KV heads
    per = [facts.kv_bytes_per_token(2, t) for t in (1, 2, 4, 8)]
    assert per == [2 * 48 * 4 * 128 * 2, 2 * 48 * 2 * 128 * 2, 2 * 48 * 1 * 128 * 2, 2 * 48 * 1 * 128 * 2]


@pytest.mark.parametrize(
    ("dtype", "model_bytes", "expected"),
    [("auto", 2, 2.0), ("auto", None, None), ("fp8", 2, 1), ("int8_per_token_head", 2, 1), ("nvfp4", 2, 0.5),
     ("bfloat16", 4, 2), ("fp8_ds_mla", 2, None)],
)  # fmt: skip
def test_kv_element_bytes(dtype: str, model_bytes: int | None, expected: float | None) -> None:
    """KV element size: auto follows the model dtype; quantised dtypes are smaller; unknown ones None."""
    assert kv_element_bytes(dtype, model_bytes) == expected


def test_merge_prefers_cache_and_fills_gaps_from_config() -> None:
    """Facts found in the HF cache win; declared facts fill only what the cache lacks."""
    found = ModelFacts(model="m", parameter_bytes=None, num_attention_heads=32, source="HF cache snapshot abc")
    declared = ModelFacts(model="m", parameter_bytes=10, num_attention_heads=8, source="declared in config")
    merged = merge_facts(found, declared, "m")
    assert merged.parameter_bytes == 10
    assert merged.num_attention_heads == 32
    assert merged.source == "HF cache snapshot abc, gaps filled from config"


def test_nothing_known_stays_unknown() -> None:
    """Without cached files or declared facts, nothing is guessed: every fit fact is missing."""
    facts = merge_facts(None, None, "org/unknown")
    assert facts.missing == (
        "parameter_bytes", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "head_dim",
    )  # fmt: skip
    assert facts.kv_bytes_per_token(2, 1) is None


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
        (repo / "refs" / ref).write_text(commit + "\n")
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
    declared = DeclaredModelFacts(parameter_bytes=123, num_attention_heads=8, head_dim=64)
    facts = model_facts("org/absent", declared, read_model_files(tmp_path, "org/absent", None))
    assert (facts.parameter_bytes, facts.num_attention_heads, facts.source) == (123, 8, "declared in config")
    assert "num_key_value_heads" in facts.missing
