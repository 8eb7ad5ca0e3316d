"""Tests for dankserve.plan.models: HF config parsing, weight sizes, the cache layout, merging."""

from __future__ import annotations

from typing import Any

import pytest

from dankserve.plan.models import (
    ModelFacts,
    bytes_of_parameters,
    kv_element_bytes,
    merge_facts,
    parse_config,
    weights_bytes,
)

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
    [("auto", 2, 2.0), ("auto", 4, 4.0), ("auto", None, 2.0), ("fp8", 2, 1), ("int8_per_token_head", 2, 1),
     ("nvfp4", 2, 0.5), ("bfloat16", 4, 2), ("fp8_ds_mla", 2, None)],
)  # fmt: skip
def test_kv_element_bytes(dtype: str, model_bytes: int | None, expected: float | None) -> None:
    """KV element size: auto follows the model dtype (bf16/fp16 when unknown, as vLLM's --dtype auto computes);
    quantised dtypes are smaller; unknown ones None."""
    assert kv_element_bytes(dtype, model_bytes) == expected


def test_declared_facts_override_found_ones() -> None:
    """model_facts is an override: declared values win over the HF cache's, and fill its gaps."""
    found = ModelFacts(model="m", parameter_bytes=None, num_attention_heads=32, num_hidden_layers=4, source="HF cache")
    declared = ModelFacts(model="m", parameter_bytes=10, num_attention_heads=8, source="declared in config")
    merged = merge_facts(found, declared, "m")
    assert (merged.parameter_bytes, merged.num_attention_heads, merged.num_hidden_layers) == (10, 8, 4)
    assert merged.source == "HF cache, num_attention_heads, parameter_bytes from model_facts"


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ({"BF16": 1000}, 2000),
        ({"F8_E4M3": 1000, "BF16": 10, "F32": 1}, 1024),
        ({"U8": 5, "F4": 10}, 10),
        ({"Q9": 1}, None),  # an unknown dtype: the size stays unknown, never guessed
        ({}, None),
    ],
)
def test_bytes_of_parameters(counts: dict[str, int], expected: int | None) -> None:
    """Weight bytes from safetensors' parameter counts per dtype."""
    assert bytes_of_parameters(counts) == expected


def test_nothing_known_stays_unknown() -> None:
    """Without cached files or declared facts, nothing is guessed: every fit fact is missing."""
    facts = merge_facts(None, None, "org/unknown")
    assert facts.missing == (
        "parameter_bytes", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "head_dim",
    )  # fmt: skip
    assert facts.kv_bytes_per_token(2, 1) is None
