"""LoRA adapters in the plan: what an adapter directory says, and the rules for vLLM's LoRA flags. Pure.

The flags (vLLM 0.26, vllm/engine/arg_utils.py and vllm/config/lora.py): `--enable-lora`,
`--max-loras` (adapters in one batch, default 1), `--max-lora-rank` (one of 1, 8, 16, 32, 64,
128, 256, 320, 512; default 16), `--max-cpu-loras` (adapters kept in CPU memory, default
max_loras) and `--lora-modules name=path ...` (loaded at start-up; one that fails to load stops
the server). Memory (vllm/lora/layers/base_linear.py, column_parallel_linear.py
`create_lora_weights`): every LoRA-capable linear layer of every decoder layer gets
`max_loras` preallocated slots of A (max_rank x input, per slice) and B (output x max_rank)
in the model's dtype, whatever the adapters target (unless `--lora-target-modules` narrows
it): that is what the fit check counts. The adapters themselves wait in CPU memory
(max_cpu_loras of them): that is host RAM.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dankserve.plan.models import ModelFacts
from dankserve.plan.rules import GIB, Decision, gib

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""`--max-lora-rank`'s choices in vLLM 0.26 (vllm/config/lora.py MaxLoRARanks)."""
MAX_ADAPTER_CONFIG_BYTES = 64 * 1024
"""adapter_config.json is a few hundred bytes; anything this large is not one."""
MAX_LORAS_CAP = 4
"""Slots preallocated by default at most: each costs GPU memory whether it is used or not."""
RUNTIME_UPDATE_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
"""vLLM serves /v1/load_lora_adapter and /v1/unload_lora_adapter only with this set (envs.py: 1 or true)."""
CONTAINER_ADAPTERS_DIR = "/dankserve/adapters"
"""Where a local adapter directory is mounted (read-only) in a container."""


class AdapterConfigError(ValueError):
    """adapter_config.json cannot describe an adapter vLLM loads; the message names what is wrong."""


@dataclass(frozen=True)
class AdapterFacts:
    """One adapter as the plan needs it: its served name, where the server reads it, and its shape."""

    name: str
    server_path: str
    """The directory as the server sees it (in the container, or on the host for a process)."""
    rank: int
    target_modules: tuple[str, ...]
    weights_bytes: int
    """The adapter's safetensors (or .bin) files: what one adapter takes in CPU memory."""
    host_dir: str | None = None
    """A local directory to mount into a container (None: in the HF cache, or a process)."""


MAX_LORA_ALPHA = 1e6
"""Far above any trained adapter's (they use 8 to 512); the scale lora_alpha / r multiplies every delta."""


def _no_constant(word: str) -> float:
    """json's NaN, Infinity and -Infinity, which JSON itself does not have: refused."""
    raise ValueError(f"{word} is not a JSON number")


def parse_adapter_config(name: str, raw: bytes) -> tuple[int, tuple[str, ...]]:
    """The rank and target modules of a PEFT adapter_config.json, read as hostile input."""
    if len(raw) > MAX_ADAPTER_CONFIG_BYTES:
        raise AdapterConfigError(f"adapter {name}: adapter_config.json is over {MAX_ADAPTER_CONFIG_BYTES} bytes")
    try:
        document = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise AdapterConfigError(f"adapter {name}: adapter_config.json is not JSON ({str(exc)[:120]})") from None
    if not isinstance(document, dict):
        raise AdapterConfigError(f"adapter {name}: adapter_config.json is not a JSON object")
    kind = document.get("peft_type", "LORA")
    if kind != "LORA":
        raise AdapterConfigError(f"adapter {name}: peft_type {str(kind)[:40]!r} is not LORA: vLLM serves LoRA only")
    rank = document.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= VLLM_LORA_RANKS[-1]:
        raise AdapterConfigError(
            f"adapter {name}: rank r = {str(rank)[:40]} is not an integer from 1 to {VLLM_LORA_RANKS[-1]} "
            "(vLLM's largest --max-lora-rank)"
        )
    alpha = document.get("lora_alpha")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool):
        raise AdapterConfigError(f"adapter {name}: lora_alpha is missing (vLLM requires r, lora_alpha, target_modules)")
    if not (math.isfinite(alpha) and 0 < alpha <= MAX_LORA_ALPHA):
        # vLLM scales the adapter by lora_alpha / r: NaN, infinite or absurd values serve garbage silently
        raise AdapterConfigError(
            f"adapter {name}: lora_alpha = {str(alpha)[:40]} is not a number above 0 and at most {MAX_LORA_ALPHA:g}"
        )
    if document.get("use_dora"):
        raise AdapterConfigError(f"adapter {name}: a DoRA adapter (use_dora): vLLM does not yet support DoRA")
    if document.get("modules_to_save"):
        raise AdapterConfigError(f"adapter {name}: modules_to_save is set: vLLM only supports it being None")
    targets = document.get("target_modules")
    if isinstance(targets, str) and 0 < len(targets) <= 256:
        modules: tuple[str, ...] = (targets,)
    elif (
        isinstance(targets, list)
        and 0 < len(targets) <= 256
        and all(isinstance(t, str) and 0 < len(t) <= 256 for t in targets)
    ):
        modules = tuple(targets)
    else:
        raise AdapterConfigError(f"adapter {name}: target_modules is missing or not a list of module names")
    return rank, modules


# --------------------------------------------------------------------------- rules


def size(value: int) -> str:
    """Bytes as GiB, or MiB below one GiB (a small model's slots)."""
    return gib(value) if value >= GIB else f"{value / (1 << 20):.1f} MiB"


def max_lora_rank(adapters: Sequence[AdapterFacts]) -> Decision[int]:
    """The smallest rank vLLM accepts that holds every adapter's rank (slots are sized by it)."""
    top = max(a.rank for a in adapters)
    value = next(r for r in VLLM_LORA_RANKS if r >= top)
    widest = next(a.name for a in adapters if a.rank == top)
    rounded = "" if value == top else f", rounded up to {value}, the next rank vLLM accepts"
    return Decision(value, f"the largest adapter rank is {top} ({widest}){rounded}")


def max_loras(adapters: Sequence[AdapterFacts]) -> Decision[int]:
    """Adapter slots per batch: one per adapter, at most MAX_LORAS_CAP (each slot is preallocated GPU memory)."""
    count = len(adapters)
    if count <= MAX_LORAS_CAP:
        return Decision(count, f"{count} adapter{'s' if count > 1 else ''}: each can be in a batch at once")
    return Decision(
        MAX_LORAS_CAP,
        f"{count} adapters, {MAX_LORAS_CAP} slots: each slot is preallocated GPU memory; requests for the others "
        "wait for a free slot (set --max-loras in extra_args for more)",
    )


def max_cpu_loras(adapters: Sequence[AdapterFacts], slots: int) -> Decision[int] | None:
    """Adapters kept in CPU memory: all of them when they outnumber the slots (vLLM's default is max_loras)."""
    if len(adapters) <= slots:
        return None
    return Decision(len(adapters), f"all {len(adapters)} adapters stay in CPU memory, none reloaded from disk")


def lora_modules(adapters: Sequence[AdapterFacts]) -> Decision[tuple[str, ...]]:
    """`name=path` for each adapter known at boot (vLLM loads them before it serves)."""
    return Decision(
        tuple(f"{a.name}={a.server_path}" for a in adapters),
        "the configured adapters, served by name (`model`), parent the base model",
    )


def lora_layer_sizes(model: ModelFacts) -> tuple[tuple[int, int], ...] | None:
    """(input, output) of each LoRA slot's A and B in one decoder layer: qkv (3 slices of A), o, gate_up
    (2 slices of A), down, as vLLM's merged layers hold them; None when the model's sizes are unknown."""
    hidden, inter = model.hidden_size, model.intermediate_size
    heads, kv_heads, head_dim = model.num_attention_heads, model.num_key_value_heads, model.head_dim
    if hidden is None or inter is None or heads is None or kv_heads is None or head_dim is None:
        return None
    q, kv = heads * head_dim, kv_heads * head_dim
    return ((3 * hidden, q + 2 * kv), (q, hidden), (2 * hidden, 2 * inter), (inter, hidden))


def lora_slot_bytes(model: ModelFacts, slots: int, rank: int) -> Decision[int] | None:
    """GPU memory vLLM preallocates for `slots` adapters of rank `rank` (all GPUs together), or None if unknown."""
    sizes = lora_layer_sizes(model)
    if sizes is None or model.num_hidden_layers is None:
        return None
    element = model.dtype_bytes or 2
    per_layer = sum(rank * (a_in + b_out) for a_in, b_out in sizes)
    total = slots * per_layer * model.num_hidden_layers * element
    return Decision(
        total,
        f"{slots} slot{'s' if slots > 1 else ''} x rank {rank} x (in + out) of q/k/v, o, gate/up, down x "
        f"{model.num_hidden_layers} layers x {element} bytes = {size(total)} preallocated",
    )


def adapters_host_bytes(adapters: Sequence[AdapterFacts], kept: int) -> int:
    """CPU memory the adapters take: the `kept` largest of them (vLLM's CPU cache)."""
    return sum(sorted((a.weights_bytes for a in adapters), reverse=True)[:kept])


def runtime_update_env(adapters: Sequence[AdapterFacts]) -> Mapping[str, str]:
    """The server answers /v1/load_lora_adapter: a reload adds and removes adapters without a restart."""
    return {RUNTIME_UPDATE_ENV: "True"} if adapters else {}


def facts_json(adapters: Sequence[AdapterFacts]) -> list[dict[str, Any]]:
    """The adapters as `dankserve plan --json` shows them."""
    return [
        {"name": a.name, "path": a.server_path, "rank": a.rank, "target_modules": list(a.target_modules)}
        for a in adapters
    ]


def container_dir(name: str) -> str:
    """Where a local adapter directory is mounted in a container: its name made a path segment, with a
    short hash so that two names never share one."""
    import hashlib

    plain = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
    return f"{CONTAINER_ADAPTERS_DIR}/{plain}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class LoraSizing:
    """The LoRA side of a plan: slots, rank, their GPU memory and the adapters' host RAM."""

    slots: Decision[int] | None = None
    rank: Decision[int] | None = None
    cpu_loras: Decision[int] | None = None
    slot_bytes: int = 0
    """GPU memory preallocated for the slots (all GPUs together; 0 when no adapters or unknown)."""
    slot_reason: str = ""
    host_bytes: int = 0


def lora_sizing(adapters: Sequence[AdapterFacts], model: ModelFacts) -> LoraSizing:
    """Slots, rank and memory for the adapters (an empty sizing without adapters)."""
    if not adapters:
        return LoraSizing()
    slots, rank = max_loras(adapters), max_lora_rank(adapters)
    cpu = max_cpu_loras(adapters, slots.value)
    memory = lora_slot_bytes(model, slots.value, rank.value)
    kept = cpu.value if cpu is not None else slots.value
    if memory is None:
        reason = "LoRA slot memory not estimated (the model's hidden or intermediate size is unknown)"
        return LoraSizing(slots, rank, cpu, 0, reason, adapters_host_bytes(adapters, kept))
    return LoraSizing(slots, rank, cpu, memory.value, memory.reason, adapters_host_bytes(adapters, kept))


def flag_choices(
    adapters: Sequence[AdapterFacts], sizing: LoraSizing
) -> list[tuple[str, str | tuple[str, ...] | None, str]]:
    """The LoRA flags with their reasons, in argv order (none without adapters)."""
    if not adapters or sizing.slots is None or sizing.rank is None:
        return []
    names = ", ".join(a.name for a in adapters)
    choices: list[tuple[str, str | tuple[str, ...] | None, str]] = [
        (
            "--enable-lora",
            None,
            f"adapters configured ({names}); {RUNTIME_UPDATE_ENV} lets a reload load and unload them",
        ),
        ("--max-loras", str(sizing.slots.value), f"{sizing.slots.reason}; {sizing.slot_reason}"),
        ("--max-lora-rank", str(sizing.rank.value), sizing.rank.reason),
    ]
    if sizing.cpu_loras is not None:
        choices.append(("--max-cpu-loras", str(sizing.cpu_loras.value), sizing.cpu_loras.reason))
    modules = lora_modules(adapters)
    choices.append(("--lora-modules", modules.value, modules.reason))
    return choices
