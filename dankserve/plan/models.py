"""Model facts the planner needs: weight bytes, attention shape, context length, MoE, quantisation.

They come from the Hugging Face cache layout under `hf_cache_dir`
(`hub/models--ORG--NAME/snapshots/REV/config.json`, the weights' total size from
`model.safetensors.index.json`'s `metadata.total_size`, else the sum of the `*.safetensors`
sizes), and fill their gaps from the deployment's declared `model_facts`. A fact found in
neither stays None: the checks that need it are skipped with a warning, never guessed.

Everything here is pure: `dankserve.hub.cache` reads the files, `dankserve.hub.remote` asks
the Hub.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from dankserve.settings import ModelFactsSettings

CONTAINER_HF_CACHE = "/root/.cache/huggingface"

DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float8_e4m3fn": 1, "fp8": 1}

# KV-cache dtype -> bytes per element (a 4-bit format is half a byte; k8v4 averages 6 bits).
KV_DTYPE_BYTES: Mapping[str, float] = {
    "float16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "fp8_per_token_head": 1,
    "int8_per_token_head": 1,
    "int4_per_token_head": 0.5,
    "nvfp4": 0.5,
    "nvfp4_4over6": 0.5,
    "turboquant_k8v4": 0.75,
    "turboquant_4bit_nc": 0.5,
    "ultraquant_4bit": 0.5,
}


@dataclass(frozen=True)
class ModelFacts:
    """What is known about a model; None where neither the HF cache nor the config says."""

    model: str
    parameter_bytes: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    num_hidden_layers: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int | None = None
    moe: bool | None = None
    num_experts: int | None = None
    quantization: str | None = None
    dtype_bytes: int | None = None
    kv_layout_standard: bool = True
    """False for attention that the per-token KV estimate does not describe (MLA, sliding-window,
    linear-attention hybrids): the KV-size checks are then skipped."""
    kv_layout_note: str | None = None
    model_type: str | None = None
    """config.json's model_type (qwen3, llama ...): picks the family's parsers."""
    source: str = "unknown"
    """Where the facts came from: the snapshot directory, 'declared in config', or both."""
    hidden_size: int | None = None
    intermediate_size: int | None = None
    """The two sizes only the LoRA slot estimate reads (plan/lora.py)."""

    @property
    def missing(self) -> tuple[str, ...]:
        """Names of the facts the fit checks need but nobody stated."""
        needed = ("parameter_bytes", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "head_dim")
        return tuple(name for name in needed if getattr(self, name) is None)

    def kv_bytes_per_token(self, kv_element_bytes: float, tensor_parallel_size: int) -> float | None:
        """KV-cache bytes one token takes on each GPU (K and V, every layer), or None when unknown.

        vLLM gives each rank max(1, kv_heads // tp) KV heads (heads are replicated when TP
        exceeds them; vllm/model_executor/layers/linear.py QKVParallelLinear).
        """
        if not self.kv_layout_standard:
            return None
        if self.num_key_value_heads is None or self.num_hidden_layers is None or self.head_dim is None:
            return None
        heads_per_rank = max(1, self.num_key_value_heads // tensor_parallel_size)
        return 2 * self.num_hidden_layers * heads_per_rank * self.head_dim * kv_element_bytes


VLLM_AUTO_DTYPE_BYTES = 2
"""vLLM's `--dtype auto` computes in bf16 or fp16 (fp32 checkpoints are cast to fp16): the KV cache's element
size under `--kv-cache-dtype auto` when the checkpoint's dtype is not known (a model_facts without dtype_bytes)."""


def kv_element_bytes(kv_cache_dtype: str, model_dtype_bytes: int | None) -> float | None:
    """Bytes per KV element of a `--kv-cache-dtype` value ('auto': the model's dtype, bf16/fp16 when unknown, as
    vLLM's own `--dtype auto`), None for a dtype not known here."""
    if kv_cache_dtype == "auto":
        return float(model_dtype_bytes if model_dtype_bytes is not None else VLLM_AUTO_DTYPE_BYTES)
    return KV_DTYPE_BYTES.get(kv_cache_dtype)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def parse_config(model: str, config: Mapping[str, Any]) -> ModelFacts:
    """Facts from a Hugging Face `config.json` (multimodal configs: their `text_config`)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else None
    cfg: Mapping[str, Any] = {**config, **text} if text else config
    heads = _int(cfg.get("num_attention_heads"))
    kv_heads = _int(cfg.get("num_key_value_heads")) or heads  # absent: plain multi-head attention
    hidden = _int(cfg.get("hidden_size"))
    head_dim = _int(cfg.get("head_dim")) or (hidden // heads if hidden and heads else None)
    experts = next(
        (_int(cfg.get(k)) for k in ("num_experts", "num_local_experts", "n_routed_experts") if _int(cfg.get(k))),
        None,
    )
    quant = cfg.get("quantization_config") or config.get("quantization_config")
    quantization = str(quant.get("quant_method")) if isinstance(quant, Mapping) and quant.get("quant_method") else None
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype")
    layout_note = _nonstandard_kv(cfg)
    return ModelFacts(
        model=model,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        num_hidden_layers=_int(cfg.get("num_hidden_layers")),
        head_dim=head_dim,
        max_position_embeddings=_int(cfg.get("max_position_embeddings")),
        moe=experts is not None,
        num_experts=experts,
        quantization=quantization,
        dtype_bytes=DTYPE_BYTES.get(str(dtype)) if dtype else None,
        kv_layout_standard=layout_note is None,
        kv_layout_note=layout_note,
        model_type=str(config["model_type"]) if isinstance(config.get("model_type"), str) else None,
        hidden_size=hidden,
        intermediate_size=_int(cfg.get("intermediate_size")),
    )


def _nonstandard_kv(cfg: Mapping[str, Any]) -> str | None:
    """Why the per-token KV estimate would not describe this model's cache, or None when it does."""
    if cfg.get("kv_lora_rank"):
        return "multi-head latent attention (kv_lora_rank)"
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and any(t != "full_attention" for t in layer_types):
        return "mixed layer types (" + ", ".join(sorted({str(t) for t in layer_types})) + ")"
    if cfg.get("use_sliding_window") or (cfg.get("sliding_window") and cfg.get("use_sliding_window") is not False):
        return "sliding-window attention"
    return None


def weights_bytes(index: Mapping[str, Any] | None, safetensors_sizes: tuple[int, ...]) -> int | None:
    """Total weight bytes: the index's metadata.total_size, else the sum of the safetensors files."""
    if index is not None:
        metadata = index.get("metadata")
        total = metadata.get("total_size") if isinstance(metadata, Mapping) else None
        if isinstance(total, int | float) and total > 0:
            return int(total)
    return sum(safetensors_sizes) if safetensors_sizes else None


def declared_facts(model: str, declared: ModelFactsSettings) -> ModelFacts:
    """Facts written in the deployment's `model_facts` table."""
    return ModelFacts(
        model=model,
        parameter_bytes=declared.parameter_bytes,
        num_attention_heads=declared.num_attention_heads,
        num_key_value_heads=declared.num_key_value_heads,
        num_hidden_layers=declared.num_hidden_layers,
        head_dim=declared.head_dim,
        max_position_embeddings=declared.max_position_embeddings,
        moe=declared.moe,
        quantization=declared.quantization,
        dtype_bytes=declared.dtype_bytes,
        hidden_size=declared.hidden_size,
        intermediate_size=declared.intermediate_size,
        source="declared in config",
    )


def merge_facts(found: ModelFacts | None, declared: ModelFacts | None, model: str) -> ModelFacts:
    """The found facts (HF cache or Hub) with the declared ones on top: `model_facts` overrides."""
    if found is None and declared is None:
        return ModelFacts(model=model)
    if found is None:
        assert declared is not None
        return declared
    if declared is None:
        return found
    overridden = {
        f.name: getattr(declared, f.name)
        for f in fields(ModelFacts)
        if f.name not in {"model", "source", "kv_layout_standard", "kv_layout_note", "model_type"}
        and getattr(declared, f.name) is not None
        and getattr(declared, f.name) != getattr(found, f.name)
    }
    source = f"{found.source}, {', '.join(sorted(overridden))} from model_facts" if overridden else found.source
    return replace(found, **overridden, source=source)


# safetensors dtype names -> bytes per parameter (the header's `dtype`)
SAFETENSORS_DTYPE_BYTES: Mapping[str, float] = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F4": 0.5,
    "F6_E2M3": 0.75,
    "F6_E3M2": 0.75,
}


def bytes_of_parameters(parameter_count: Mapping[str, int]) -> int | None:
    """Weight bytes from safetensors' parameter count per dtype (None when a dtype is unknown)."""
    total = 0.0
    for dtype, count in parameter_count.items():
        size = SAFETENSORS_DTYPE_BYTES.get(dtype.upper())
        if size is None:
            return None
        total += size * count
    return int(total) if total > 0 else None


def facts_from_hub(model: str, config: Mapping[str, Any], parameter_bytes: int | None, commit: str) -> ModelFacts:
    """Facts from a Hub repo's config.json and its safetensors headers."""
    return replace(
        parse_config(model, config), parameter_bytes=parameter_bytes, source=f"the Hub, commit {commit[:12]}"
    )


@dataclass(frozen=True)
class ModelFiles:
    """The raw files of one cached model snapshot."""

    snapshot: Path
    config: Mapping[str, Any]
    index: Mapping[str, Any] | None
    safetensors_sizes: tuple[int, ...]


def facts_from_files(model: str, files: ModelFiles) -> ModelFacts:
    """Facts from a snapshot's files."""
    facts = parse_config(model, files.config)
    return replace(
        facts,
        parameter_bytes=weights_bytes(files.index, files.safetensors_sizes),
        source=f"HF cache snapshot {files.snapshot.name}",
    )


def model_facts(model: str, declared: ModelFactsSettings | None, files: ModelFiles | None) -> ModelFacts:
    """All known facts of a deployment's model, from its cached files and its declared values."""
    found = facts_from_files(model, files) if files is not None else None
    return merge_facts(found, declared_facts(model, declared) if declared is not None else None, model)
