"""What each vLLM release's `vllm serve` accepts: flags and the value sets the planner uses.

The data is `dankserve/data/vllm_catalogue.json`, generated from the release wheels by
`scripts/gen_vllm_catalogue.py` (every release from 0.10.0 to 0.34.0; each fact names the
wheel file it was read from), with the variables each release's `vllm/envs.py` reads. It is read once, on first use.

A version that is not catalogued resolves to the newest catalogued patch of the same minor
release, else to the newest release known; either way the capabilities carry a warning.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

DEFAULT_CONTAINER_CACHE_ROOT = "/root/.cache/vllm"


@dataclass(frozen=True)
class VllmCapabilities:
    """The flags and value sets of one vLLM release, each traceable to a file in its wheel."""

    version: str
    """The catalogued release these facts describe."""
    requested: str | None
    """The version that was asked for (None: none was known)."""
    flags: Mapping[str, str]
    """Every option string `vllm serve` accepts -> the wheel file that adds it."""
    deprecated_flags: frozenset[str]
    kv_cache_dtypes: tuple[str, ...]
    kv_cache_dtypes_source: str
    gpu_memory_utilization_default: float | None
    max_model_len_auto: bool
    attention_backends: tuple[str, ...]
    speculative_methods: tuple[str, ...]
    kv_offloading_backends: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    env: frozenset[str] = frozenset()
    """The variables the release's `vllm/envs.py` reads (empty: not catalogued)."""
    removed_env: Mapping[str, str] = field(default_factory=dict)
    """Variables the release refuses, with vLLM's own migration hint."""
    subcommands: frozenset[str] = frozenset()
    """`vllm` subcommands (`download-kernels` from 0.32)."""
    checkpoint_routes: bool = False
    """`/checkpoint/prepare|restore|status` with sleep mode (0.34)."""
    sleep_answers_json: bool = False
    """`/sleep` answers `{"status": "sleeping", "level": n}` (0.32+; before: an empty 200)."""
    sleep_metrics: bool = False
    """`vllm:sleep_mode_operation_duration_seconds` and `vllm:sleep_mode_operations_in_flight` (0.32+)."""

    def has(self, flag: str) -> bool:
        """Whether this release's `vllm serve` accepts the option string."""
        return flag in self.flags

    def source(self, flag: str) -> str | None:
        """The wheel file that adds the flag, or None when the release lacks it."""
        return self.flags.get(flag)


@dataclass(frozen=True)
class Catalogue:
    """All catalogued releases, oldest first."""

    releases: tuple[str, ...]
    entries: Mapping[str, Mapping[str, Any]]
    replacements: Mapping[str, str] = field(default_factory=dict)
    """Removed flag -> what replaces it (`flag_replacements` of the catalogue)."""

    @property
    def newest(self) -> str:
        return self.releases[-1]

    def first_with(self, flag: str) -> str | None:
        """The oldest catalogued release whose `vllm serve` accepts the flag."""
        for version in self.releases:
            if any(flag in names for names in self.entries[version]["flags"].values()):
                return version
        return None

    def last_with(self, flag: str) -> str | None:
        """The newest catalogued release whose `vllm serve` accepts the flag."""
        for version in reversed(self.releases):
            if any(flag in names for names in self.entries[version]["flags"].values()):
                return version
        return None

    def removed_by(self, name: str, version: str, *, env: bool = False) -> str | None:
        """The release that removed a flag (or, with `env`, a variable of `vllm/envs.py`) that `version` lacks:
        the one after the newest older release that had it (None: no older release had it)."""
        key = version_key(version)
        older = [v for v in self.releases if version_key(v) <= key]
        for before, after in zip(reversed(older[:-1]), reversed(older[1:]), strict=True):
            entry = self.entries[before]
            had = name in entry.get("env", ()) if env else any(name in n for n in entry["flags"].values())
            if had:
                return after
        return None

    def env_successor(self, variable: str) -> str | None:
        """The flag a release named as the successor of a variable it deprecated (`env_successors`), newest first."""
        for version in reversed(self.releases):
            successor = self.entries[version].get("env_successors", {}).get(variable)
            if successor is not None:
                return str(successor)
        return None

    def flag_replacement(self, flag: str) -> str | None:
        """What replaces a removed flag, as the last releases that had it said (None: nothing named)."""
        value = self.replacements.get(flag)
        return str(value) if value is not None else None


def version_key(version: str) -> tuple[int, ...]:
    """Numeric sort key of a release number ('0.10.1.1' -> (0, 10, 1, 1))."""
    return tuple(int(part) for part in re.findall(r"\d+", version))


def parse_version(text: str) -> str | None:
    """A release number from a version string or image tag ('v0.33.0', '0.26.0-cu128'), or None."""
    match = re.search(r"(?<![\d.])v?(\d+\.\d+\.\d+(?:\.\d+)?)(?![\d.])", text)
    return match.group(1) if match else None


def version_from_image(image: str) -> str | None:
    """The vLLM release an image reference names in its tag (`...vllm-openai:v0.33.0` -> 0.33.0)."""
    reference = image.split("@", 1)[0]
    name, _, tag = reference.rpartition(":")
    if not name or "/" in tag:  # no tag, only a registry port
        return None
    return parse_version(tag)


def build_catalogue(data: Mapping[str, Any]) -> Catalogue:
    """The catalogue from its JSON form."""
    versions: Mapping[str, Mapping[str, Any]] = data["versions"]
    return Catalogue(
        releases=tuple(sorted(versions, key=version_key)),
        entries=versions,
        replacements=data.get("flag_replacements", {}),
    )


@cache
def load_catalogue() -> Catalogue:
    """The packaged catalogue, read once."""
    text = resources.files("dankserve").joinpath("data/vllm_catalogue.json").read_text(encoding="utf-8")
    return build_catalogue(json.loads(text))


def resolve_version(catalogue: Catalogue, requested: str | None) -> tuple[str, tuple[str, ...]]:
    """The catalogued release to use for a requested version, and warnings about the choice."""
    newest = catalogue.newest
    span = f"{catalogue.releases[0]}-{newest}"
    if requested is None:
        return newest, (f"vLLM version unknown (image tag and vllm_version tell none): assuming {newest}",)
    version = parse_version(requested)
    if version is None:
        return newest, (f"vLLM version {requested!r} is not a release number: assuming {newest}",)
    if version in catalogue.entries:
        return version, ()
    key = version_key(version)
    same_minor = [v for v in catalogue.releases if version_key(v)[:2] == key[:2]]
    if same_minor:
        older = [v for v in same_minor if version_key(v) <= key]
        chosen = older[-1] if older else same_minor[0]
        return chosen, (
            f"vLLM {version} is not catalogued: using the flags of {chosen}, the nearest {key[0]}.{key[1]} release",
        )
    return newest, (f"vLLM {version} is outside the catalogue ({span}): using the flags of the newest, {newest}",)


def capabilities(version: str | None, catalogue: Catalogue | None = None) -> VllmCapabilities:
    """The capabilities of a vLLM release (unknown: the nearest or newest known, with a warning)."""
    catalogue = catalogue or load_catalogue()
    chosen, warnings = resolve_version(catalogue, version)
    entry = catalogue.entries[chosen]
    flags = {flag: path for path, names in entry["flags"].items() for flag in names}
    facts: Mapping[str, Any] = entry["facts"]

    def values(key: str) -> tuple[str, ...]:
        return tuple(str(v) for v in facts.get(key, {}).get("value", ()))

    util = facts.get("gpu_memory_utilization_default", {}).get("value")
    return VllmCapabilities(
        version=chosen,
        requested=version,
        flags=flags,
        deprecated_flags=frozenset(entry.get("deprecated_flags", ())),
        kv_cache_dtypes=values("kv_cache_dtypes"),
        kv_cache_dtypes_source=str(facts.get("kv_cache_dtypes", {}).get("source", "")),
        gpu_memory_utilization_default=float(util) if util is not None else None,
        max_model_len_auto=bool(facts.get("max_model_len_auto", {}).get("value", False)),
        attention_backends=values("attention_backends"),
        speculative_methods=values("speculative_methods"),
        kv_offloading_backends=values("kv_offloading_backends"),
        warnings=warnings,
        env=frozenset(entry.get("env", ())),
        removed_env=dict(entry.get("removed_env", {})),
        subcommands=frozenset(values("subcommands")),
        checkpoint_routes=bool(facts.get("checkpoint_routes")),
        sleep_answers_json=bool(facts.get("sleep_answers_json", {}).get("value", False)),
        sleep_metrics=bool(facts.get("sleep_metrics")),
    )
