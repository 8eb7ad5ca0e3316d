"""`extra_args` against the plan: a flag the plan also sets replaces the planned one.

Flags backed by a setting (`--max-num-seqs`, `--gpu-memory-utilization`, `--max-model-len` ...)
become that setting, so the fit checks and the reasons use the user's value; any other flag
the plan sets (`--kv-offloading-backend`, `--reasoning-parser` ...) drops the planned one and
passes as given. Flags dankserve owns (address, port, key, GPUs, caches) are refused by the
settings' own validation before this runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from dankserve.errors import ConfigError
from dankserve.plan.serve_args import split_options
from dankserve.settings import DeploymentSettings


def _int(value: str) -> int:
    return int(value.replace("_", ""))


def _max_model_len(value: str) -> int | str:
    return "auto" if value.lower() in ("auto", "-1") else _int(value)


def _gib(value: str) -> dict[str, float]:
    return {"gib": float(value)}


# flag -> (setting key, conversion from the token; None for a bare switch)
SETTING_FLAGS: dict[str, tuple[str, Callable[[str], Any] | None]] = {
    "--gpu-memory-utilization": ("gpu_memory_utilization", float),
    "--max-model-len": ("max_model_len", _max_model_len),
    "--tensor-parallel-size": ("tensor_parallel_size", _int),
    "-tp": ("tensor_parallel_size", _int),
    "--kv-cache-dtype": ("kv_cache_dtype", str),
    "--attention-backend": ("attention_backend", str),
    "--max-num-seqs": ("max_num_seqs", _int),
    "--max-num-batched-tokens": ("max_num_batched_tokens", _int),
    "--cpu-offload-gb": ("cpu_offload", _gib),
    "--kv-offloading-size": ("kv_offload", float),
    "--revision": ("revision", str),
    "--reasoning-parser": ("reasoning_parser", str),
    "--tool-call-parser": ("tool_call_parser", str),
    "--enforce-eager": ("enforce_eager", None),
}
CANONICAL = {"-tp": "--tensor-parallel-size"}


@dataclass(frozen=True)
class Absorbed:
    """The deployment with setting-backed extra_args applied, and what is left to pass verbatim."""

    deployment: DeploymentSettings
    replaced: frozenset[str]
    """Planner flags whose value now comes from extra_args."""


def absorb(deployment: DeploymentSettings, name: str) -> Absorbed:
    """Turn setting-backed flags of extra_args into settings (validated like the config's own values)."""
    leading, options = split_options(deployment.extra_args)
    updates: dict[str, Any] = {}
    replaced: set[str] = set()
    rest: list[str] = list(leading)
    for option in options:
        entry = SETTING_FLAGS.get(option.name)
        if entry is None or len(option.values) > (0 if entry[1] is None else 1):
            rest.extend(option.tokens)
            if option.name.startswith("--"):
                replaced.add(option.name)
            continue
        key, convert = entry
        try:
            if convert is None:
                value: Any = True
            elif not option.values:
                raise ValueError("no value")
            else:
                value = convert(option.values[0])
        except ValueError:
            raise ConfigError(
                f"deployments.{name}.extra_args: {' '.join(option.tokens)!r} has no valid value",
                fix=f"give {option.name} a value vLLM takes (e.g. {option.name} 8192), or set {key} instead",
            ) from None
        updates[key] = value
        replaced.add(CANONICAL.get(option.name, option.name))
    if not updates:
        return Absorbed(deployment, frozenset(replaced))
    data = {**deployment.model_dump(exclude_unset=False), **updates, "extra_args": rest}
    try:
        updated = DeploymentSettings.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(
            f"deployments.{name}.extra_args: {problems}",
            fix="correct the value in extra_args (it is checked like the setting of the same name)",
        ) from None
    return Absorbed(updated, frozenset(replaced))
