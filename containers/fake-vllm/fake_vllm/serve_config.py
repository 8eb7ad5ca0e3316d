"""The parsed `vllm serve` arguments the stand-in acts on, as typed frozen data."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Final

# vLLM 0.33's scheduler defaults for the OpenAI server on a GPU with more than 70 GiB.
DEFAULT_MAX_NUM_BATCHED_TOKENS: Final = 8192
DEFAULT_MAX_NUM_SEQS: Final = 1024


@dataclass(frozen=True)
class ServeConfig:
    """What `vllm serve MODEL [flags]` asked for, with vLLM's defaults filled in."""

    model: str
    served_model_names: tuple[str, ...]
    host: str | None
    port: int
    uds: str | None
    """`--uds PATH`: serve on that unix socket; host and port are then ignored."""
    api_keys: tuple[str, ...]
    tensor_parallel_size: int
    gpu_memory_utilization: float
    max_model_len: int | None  # None: the model's own; -1: fit to memory
    kv_cache_memory_bytes: int | None
    kv_cache_dtype: str
    dtype: str
    quantization: str | None
    revision: str | None
    max_num_batched_tokens: int
    max_num_seqs: int
    enforce_eager: bool
    enable_prefix_caching: bool
    compilation_config: str | None
    optimization_level: str | None
    seed: int
    disable_log_stats: bool
    disable_access_log: bool
    access_log_excluded_paths: tuple[str, ...]
    hf_token: str | None
    enable_sleep_mode: bool = False
    max_num_queued_reqs: int | None = None
    """vLLM's admission limit (0.29+): unfinished requests beyond it get 503."""
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    lora_modules: tuple[str, ...] = ()
    """`--lora-modules` items as given (lora.parse_lora_modules reads them)."""

    @property
    def served_model_name(self) -> str:
        return self.served_model_names[0]


def _get(namespace: argparse.Namespace, dest: str, default: object = None) -> object:
    value = getattr(namespace, dest, default)
    return default if value is None else value


def _int(namespace: argparse.Namespace, dest: str, default: int) -> int:
    value = _get(namespace, dest, default)
    return value if isinstance(value, int) else default


def _optional_int(namespace: argparse.Namespace, dest: str) -> int | None:
    value = _get(namespace, dest)
    return int(value) if isinstance(value, int | str) and str(value).isdigit() else None


def _optional_str(namespace: argparse.Namespace, dest: str) -> str | None:
    value = _get(namespace, dest)
    return str(value) if value is not None else None


def _str_tuple(namespace: argparse.Namespace, dest: str) -> tuple[str, ...]:
    value = _get(namespace, dest)
    if value is None:
        return ()
    if isinstance(value, list | tuple):
        return tuple(str(item) for item in value)
    return (str(value),)


def serve_config_from(namespace: argparse.Namespace, env_api_key: str | None) -> ServeConfig:
    """Build the ServeConfig from the parsed namespace (`model_tag` already merged into `model`)."""
    model = str(_get(namespace, "model", "Qwen/Qwen3-0.6B"))
    served = _str_tuple(namespace, "served_model_name") or (model,)
    api_keys = _str_tuple(namespace, "api_key") or ((env_api_key,) if env_api_key else ())
    utilization = _get(namespace, "gpu_memory_utilization", 0.92)
    max_model_len = _get(namespace, "max_model_len")
    kv_bytes = _get(namespace, "kv_cache_memory_bytes")
    prefix_caching = _get(namespace, "enable_prefix_caching", True)
    excluded = _optional_str(namespace, "disable_access_log_for_endpoints") or ""
    return ServeConfig(
        model=model,
        served_model_names=served,
        host=_optional_str(namespace, "host"),
        port=_int(namespace, "port", 8000),
        uds=_optional_str(namespace, "uds"),
        api_keys=api_keys,
        tensor_parallel_size=max(1, _int(namespace, "tensor_parallel_size", 1)),
        gpu_memory_utilization=float(utilization) if isinstance(utilization, int | float) else 0.92,
        max_model_len=max_model_len if isinstance(max_model_len, int) else None,
        kv_cache_memory_bytes=kv_bytes if isinstance(kv_bytes, int) and kv_bytes > 0 else None,
        kv_cache_dtype=str(_get(namespace, "kv_cache_dtype", "auto")),
        dtype=str(_get(namespace, "dtype", "auto")),
        quantization=_optional_str(namespace, "quantization"),
        revision=_optional_str(namespace, "revision"),
        max_num_batched_tokens=_int(namespace, "max_num_batched_tokens", DEFAULT_MAX_NUM_BATCHED_TOKENS),
        max_num_seqs=_int(namespace, "max_num_seqs", DEFAULT_MAX_NUM_SEQS),
        enforce_eager=bool(_get(namespace, "enforce_eager", False)),
        enable_prefix_caching=bool(prefix_caching),
        compilation_config=_optional_str(namespace, "compilation_config"),
        optimization_level=_optional_str(namespace, "optimization_level"),
        seed=_int(namespace, "seed", 0),
        disable_log_stats=bool(_get(namespace, "disable_log_stats", False)),
        disable_access_log=bool(_get(namespace, "disable_uvicorn_access_log", False)),
        access_log_excluded_paths=tuple(path.strip() for path in excluded.split(",") if path.strip()),
        hf_token=_optional_str(namespace, "hf_token"),
        enable_sleep_mode=bool(_get(namespace, "enable_sleep_mode", False)),
        max_num_queued_reqs=_optional_int(namespace, "max_num_queued_reqs"),
        enable_lora=bool(_get(namespace, "enable_lora", False)),
        max_loras=_int(namespace, "max_loras", 1),
        max_lora_rank=_int(namespace, "max_lora_rank", 16),
        lora_modules=_str_tuple(namespace, "lora_modules"),
    )
