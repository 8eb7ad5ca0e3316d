"""The torch.compile cache under VLLM_CACHE_ROOT: its key (pure) and its artifacts (files).

Real layout (vllm/compilation/backends.py, decorators.py): the backend cache in
`torch_compile_cache/<sha256[:10]>/rank_<r>_<dp>/backbone/` (vllm_compile_cache.py and
friends) and the AOT-compiled model in `torch_compile_cache/torch_aot_compile/<sha256>/
rank_<r>_<dp>/model`; a boot is a hit when the AOT file loads. The key hashes the vLLM version,
the model config (model path string, dtype, max length, quantization, revision), parallel and
scheduler config, the compilation config, the GPU name and the `VLLM_*` environment, minus
the factors vLLM ignores: gpu_memory_utilization, kv_cache_memory_bytes, paths, the API key,
logging (vllm/envs.py compile_factors, vllm/config/cache.py compute_hash).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from . import VLLM_VERSION
from .serve_config import ServeConfig

# vllm/envs.py compile_factors() ignored_factors, the ones a deployment is likely to set.
IGNORED_ENV_FACTORS: Final = frozenset(
    {
        "VLLM_CACHE_ROOT",
        "VLLM_CONFIG_ROOT",
        "VLLM_ENABLE_STARTUP_PLAN",
        "VLLM_API_KEY",
        "VLLM_PORT",
        "VLLM_HOST_IP",
        "VLLM_RPC_BASE_PATH",
        "VLLM_DEBUG_DUMP_PATH",
        "VLLM_XLA_CACHE_PATH",
        "VLLM_USE_MODELSCOPE",
        "VLLM_USAGE_STATS_SERVER",
        "VLLM_NO_USAGE_STATS",
        "VLLM_DO_NOT_TRACK",
        "VLLM_LOGGING_LEVEL",
        "VLLM_LOGGING_PREFIX",
        "VLLM_LOGGING_STREAM",
        "VLLM_LOGGING_CONFIG_PATH",
        "VLLM_LOGGING_COLOR",
        "VLLM_LOG_STATS_INTERVAL",
        "VLLM_HTTP_TIMEOUT_KEEP_ALIVE",
        "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH",
        "VLLM_WORKER_MULTIPROC_METHOD",
        "VLLM_SERVER_DEV_MODE",
        "VLLM_DISABLE_LOG_LOGO",
        "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR",
        "VLLM_TUNED_CONFIG_FOLDER",
        "VLLM_ASSETS_CACHE",
        "VLLM_MEDIA_CACHE",
    }
)


@dataclass(frozen=True)
class CompileCacheKey:
    """The two hashes that name a boot's compile artifacts, and what went into them."""

    factors: Mapping[str, object]
    backend_hash: str  # 10 hex digits, torch_compile_cache/<hash>
    aot_hash: str  # 64 hex digits, torch_compile_cache/torch_aot_compile/<hash>


def compile_cache_key(config: ServeConfig, gpu_name: str, env: Mapping[str, str]) -> CompileCacheKey:
    """Hash what decides the compiled graphs; flags that only size memory stay out."""
    env_factors = {
        name: value
        for name, value in sorted(env.items())
        if name.startswith("VLLM_") and name not in IGNORED_ENV_FACTORS
    }
    factors: dict[str, object] = {
        "vllm_version": VLLM_VERSION,
        "model": config.model,
        "dtype": config.dtype,
        "max_model_len": config.max_model_len,
        "quantization": config.quantization,
        "revision": config.revision,
        "kv_cache_dtype": config.kv_cache_dtype,
        "tensor_parallel_size": config.tensor_parallel_size,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "max_num_seqs": config.max_num_seqs,
        "enforce_eager": config.enforce_eager,
        "compilation_config": config.compilation_config,
        "optimization_level": config.optimization_level,
        "gpu_name": gpu_name,
        "env": env_factors,
    }
    digest = hashlib.sha256(json.dumps(factors, sort_keys=True).encode()).hexdigest()
    return CompileCacheKey(
        factors=factors,
        backend_hash=digest[:10],
        aot_hash=hashlib.sha256(("aot:" + digest).encode()).hexdigest(),
    )


def cache_root(env: Mapping[str, str]) -> Path:
    """VLLM_CACHE_ROOT, defaulting like vLLM to ~/.cache/vllm (XDG_CACHE_HOME respected)."""
    if root := env.get("VLLM_CACHE_ROOT"):
        return Path(os.path.expanduser(root))
    xdg = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "vllm"


def backend_cache_dir(root: Path, key: CompileCacheKey, rank: int) -> Path:
    return root / "torch_compile_cache" / key.backend_hash / f"rank_{rank}_0" / "backbone"


def aot_model_path(root: Path, key: CompileCacheKey, rank: int) -> Path:
    return root / "torch_compile_cache" / "torch_aot_compile" / key.aot_hash / f"rank_{rank}_0" / "model"


def artifacts_present(root: Path, key: CompileCacheKey, ranks: int) -> bool:
    """A hit needs every rank's AOT model file, as vLLM's loader does."""
    return all(aot_model_path(root, key, rank).is_file() for rank in range(ranks))


def write_artifacts(root: Path, key: CompileCacheKey, ranks: int, compile_range: str) -> None:
    """Write what a compile miss leaves behind, atomically per file."""
    for rank in range(ranks):
        backend = backend_cache_dir(root, key, rank)
        backend.mkdir(parents=True, exist_ok=True)
        _write_atomically(backend / "cache_key_factors.json", json.dumps(key.factors, indent=2, sort_keys=True))
        _write_atomically(
            backend / "vllm_compile_cache.py",
            "# stand-in torch.compile artifact index\n"
            f"{{({compile_range!r}, 0, 'inductor_standalone'): 'artifact_compile_range_{compile_range}_subgraph_0'}}\n",
        )
        model = aot_model_path(root, key, rank)
        model.parent.mkdir(parents=True, exist_ok=True)
        (model.parent.parent / "inductor_cache").mkdir(exist_ok=True)
        _write_atomically(model, f"stand-in AOT compiled model {key.aot_hash} rank {rank}\n")


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)
