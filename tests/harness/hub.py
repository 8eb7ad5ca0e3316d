"""The stand-in Hub the tests plan and pull against, with the models they name.

Real configs (Qwen3-8B, Qwen3-30B-A3B) with weights of the real size written sparse (planning
reads only the safetensors headers), small repos for the CLI tests, a gated one, and a slow
one (for interrupted, resumed downloads).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dankserve.testing.hub import StandInHub

QWEN3_8B_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "head_dim": 128,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 36,
    "max_position_embeddings": 40960,
    "torch_dtype": "bfloat16",
}
QWEN3_8B_PARAMETERS = 8_190_735_360
QWEN3_30B_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "head_dim": 128,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "num_hidden_layers": 48,
    "max_position_embeddings": 40960,
    "num_experts": 128,
    "torch_dtype": "bfloat16",
}
QWEN3_30B_PARAMETERS = 30_532_122_624
SMALL_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "num_hidden_layers": 16,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}
SMALL_PARAMETERS = 1_000_000_000
SLOW_BYTES_PER_SECOND = 4 << 20


def tensors_of(parameters: int, parts: int, dtype: str = "BF16") -> dict[str, tuple[str, Sequence[int]]]:
    """`parts` tensors holding `parameters` in total (the last one takes the remainder)."""
    each = math.ceil(parameters / parts)
    shapes: dict[str, tuple[str, Sequence[int]]] = {}
    left = parameters
    for i in range(parts):
        count = min(each, left)
        shapes[f"model.layers.{i}.weight"] = (dtype, [count])
        left -= count
    return shapes


def populate(hub: StandInHub, models: Mapping[str, tuple[dict[str, Any], int]] | None = None) -> StandInHub:
    """The tests' models on a stand-in Hub."""
    hub.add_model("Qwen/Qwen3-8B", QWEN3_8B_CONFIG, tensors_of(QWEN3_8B_PARAMETERS, 10), shards=5)
    hub.add_model("Qwen/Qwen3-30B-A3B", QWEN3_30B_CONFIG, tensors_of(QWEN3_30B_PARAMETERS, 16), shards=16)
    for repo in ("o/a", "o/b", "o/c", "m/m", "org/model-0", "org/model-1"):
        hub.add_model(repo, SMALL_CONFIG, tensors_of(SMALL_PARAMETERS, 2))
    hub.add_model("org/gated", SMALL_CONFIG, tensors_of(SMALL_PARAMETERS, 2), gated=True)
    hub.add_model("org/tagged", SMALL_CONFIG, tensors_of(SMALL_PARAMETERS, 2), revisions=("v1.0",))
    for repo, (config, parameters) in (models or {}).items():
        hub.add_model(repo, config, tensors_of(parameters, 2))
    return hub


def small_repo(hub: StandInHub, repo: str, size: int, *, bytes_per_second: float | None = None) -> None:
    """A repo whose weights are real bytes (for downloads): config, tokenizer and one weight file."""
    hub.add_model(repo, SMALL_CONFIG, {"w": ("BF16", [1])}, bytes_per_second=bytes_per_second)
    hub.add_large_file(repo, "model.safetensors", size)  # replaces the tiny one
    hub.add_file(repo, "pytorch_model.bin", b"\0" * 1024, lfs=True)  # another format: left out by a pull


def hub_env(hub: StandInHub, root: Path) -> dict[str, str]:
    """The environment that points dankserve and huggingface_hub at the stand-in Hub."""
    return {
        "HF_ENDPOINT": hub.url,
        "DANKSERVE_STATE_DIR": str(root / "state"),
        "DANKSERVE_HF_CACHE_DIR": str(root / "hf"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HOME": str(root / "hf-home"),  # huggingface_hub's own files (token, locks) stay in the test's dir
    }
