"""LoRA adapters as vLLM 0.26 serves them (read from the 0.26.0 wheel).

`--lora-modules` items are `name=path` or JSON (vllm/entrypoints/openai/cli_args.py
LoRAParserAction); each is loaded before the server answers, and one that fails stops it
(`init_static_loras` raises ValueError with the error's message). Loading checks the adapter
like vllm/lora/peft_helper.py: adapter_config.json with r, lora_alpha and target_modules, r at
most `--max-lora-rank` ("LoRA rank R is greater than max_lora_rank M."); a missing directory is
LoRAAdapterNotFoundError ("Loading lora NAME failed: No adapter found for PATH", 404), anything
else an InternalServerError (500) carrying the exception's text
(vllm/entrypoints/openai/models/serving.py). Without `--enable-lora` the engine refuses any
adapter ("LoRA is not enabled. Use --enable-lora to enable LoRA.").
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from http import HTTPStatus


@dataclass(frozen=True)
class LoraModule:
    name: str
    path: str


@dataclass
class LoraRegistry:
    """The adapters the server serves, by name, in load order (vLLM keeps a dict: insertion order)."""

    enabled: bool
    max_rank: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    adapters: dict[str, str] = field(default_factory=dict)

    def load(self, name: str, path: str, inplace: bool = False) -> tuple[int, str, str]:
        """(status, message, error type): 200 on success, vLLM's codes and messages otherwise."""
        if not name or not path:
            return HTTPStatus.BAD_REQUEST, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput"
        with self.lock:
            if not inplace and name in self.adapters:
                return (
                    HTTPStatus.BAD_REQUEST,
                    f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in place, "
                    "set 'load_inplace' to True.",
                    "InvalidUserInput",
                )
            problem = self.check(name, path)
            if problem is not None:
                return problem
            self.adapters[name] = path
        return HTTPStatus.OK, f"Success: LoRA adapter '{name}' added successfully.", ""

    def check(self, name: str, path: str) -> tuple[int, str, str] | None:
        if not self.enabled:
            return (
                HTTPStatus.INTERNAL_SERVER_ERROR,
                "LoRA is not enabled. Use --enable-lora to enable LoRA.",
                "InternalServerError",
            )
        config = os.path.join(os.path.expanduser(path), "adapter_config.json")
        if not os.path.isfile(config):
            return (
                HTTPStatus.NOT_FOUND,
                f"Loading lora {name} failed: No adapter found for {path}",
                "NotFoundError",
            )
        try:
            with open(config, encoding="utf-8") as handle:
                document = json.load(handle)
        except (OSError, ValueError) as exc:
            return HTTPStatus.INTERNAL_SERVER_ERROR, str(exc), "InternalServerError"
        missing = {"r", "lora_alpha", "target_modules"} - set(document if isinstance(document, dict) else {})
        if missing:
            return (
                HTTPStatus.INTERNAL_SERVER_ERROR,
                f"Missing required configuration fields: {missing}",
                "InternalServerError",
            )
        rank = document["r"]
        if isinstance(rank, int) and rank > self.max_rank:
            return (
                HTTPStatus.INTERNAL_SERVER_ERROR,
                f"LoRA rank {rank} is greater than max_lora_rank {self.max_rank}.",
                "InternalServerError",
            )
        return None

    def unload(self, name: str) -> tuple[int, str, str]:
        if not name:
            return (
                HTTPStatus.BAD_REQUEST,
                "'lora_name' needs to be provided to unload a LoRA adapter.",
                "InvalidUserInput",
            )
        with self.lock:
            if name not in self.adapters:
                return HTTPStatus.NOT_FOUND, f"The lora adapter '{name}' cannot be found.", "NotFoundError"
            del self.adapters[name]
        return HTTPStatus.OK, f"Success: LoRA adapter '{name}' removed successfully.", ""

    def names(self) -> list[tuple[str, str]]:
        with self.lock:
            return list(self.adapters.items())

    def has(self, name: str) -> bool:
        with self.lock:
            return name in self.adapters


def parse_lora_modules(items: tuple[str, ...]) -> tuple[LoraModule, ...] | str:
    """`--lora-modules` as vLLM parses it; a string is argparse's error message."""
    modules: list[LoraModule] = []
    for item in items:
        if not item:
            continue
        if "=" in item and "," not in item:
            parts = item.split("=")
            if len(parts) != 2:  # vLLM's `name, path = item.split("=")` raises here
                return f"Invalid fields for --lora-modules: {item}"
            modules.append(LoraModule(parts[0], parts[1]))
            continue
        try:
            document = json.loads(item)
        except ValueError:
            return f"Invalid JSON format for --lora-modules: {item}"
        if not isinstance(document, dict) or not isinstance(document.get("name"), str):
            return f"Invalid fields for --lora-modules: {item}"
        modules.append(LoraModule(document["name"], str(document.get("path", ""))))
    return tuple(modules)


def adapter_token_ids(name: str, max_tokens: int) -> list[int]:
    """An adapter's deterministic completion ids: shifted from the base model's (100 + i) by the name's hash."""
    import hashlib

    offset = 1000 + int.from_bytes(hashlib.sha256(name.encode()).digest()[:2], "big")
    return [offset + index % 9 for index in range(max(0, max_tokens))]
