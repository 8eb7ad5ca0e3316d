"""Tests for dankserve.plan.catalogue and the generated catalogue data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dankserve.plan.catalogue import (
    capabilities,
    load_catalogue,
    parse_version,
    resolve_version,
    version_from_image,
    version_key,
)

REPO = Path(__file__).resolve().parent.parent.parent
FAKE_ARGS = REPO / "containers" / "fake-vllm" / "vllm_args_0.33.json"

# FACTS.md, "Flags": the 0.33 --kv-cache-dtype values.
FACTS_033_KV_DTYPES = (
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "octave_k3v4",
    "octave_k3v3", "octave_k3v3_compact", "ultraquant_4bit", "int4_per_token_head", "int8_per_token_head",
    "fp8_per_token_head", "nvfp4", "nvfp4_4over6",
)  # fmt: skip


def test_catalogue_spans_every_release_from_0_10_to_0_34() -> None:
    """The catalogue holds 0.10.0 through 0.34.0, 0.26.0 included, with each minor's .0."""
    releases = load_catalogue().releases
    assert releases[0] == "0.10.0"
    assert releases[-1] == "0.34.0"
    for minor in range(10, 35):
        assert f"0.{minor}.0" in releases
    assert list(releases) == sorted(releases, key=version_key)


def test_033_kv_cache_dtypes_match_facts() -> None:
    """vLLM 0.33's KV-cache dtypes are exactly FACTS.md's list, and q8_0 is not one of them."""
    caps = capabilities("0.33.0")
    assert caps.kv_cache_dtypes == FACTS_033_KV_DTYPES
    assert "q8_0" not in caps.kv_cache_dtypes
    assert caps.kv_cache_dtypes_source == "vllm/config/cache.py"


@pytest.mark.parametrize(
    ("flag", "first", "last"),
    [
        ("--swap-space", "0.10.0", "0.17.1"),
        ("--kv-cache-memory-bytes", "0.10.2", "0.34.0"),
        ("--kv-offloading-size", "0.11.1", "0.34.0"),
        ("--kv-offloading-backend", "0.11.1", "0.34.0"),
        ("--attention-backend", "0.13.0", "0.34.0"),
        ("--cpu-offload-params", "0.17.0", "0.34.0"),
        ("--numa-bind", "0.20.0", "0.34.0"),
        ("--numa-bind-nodes", "0.20.0", "0.34.0"),
        ("--spec-method", "0.22.0", "0.34.0"),
        ("--speculative-config", "0.10.0", "0.34.0"),
        ("--cpu-offload-gb", "0.10.0", "0.34.0"),
    ],
)
def test_flag_lifetimes(flag: str, first: str, last: str) -> None:
    """Each planner flag exists exactly from its first to its last catalogued release (--swap-space ends at 0.17)."""
    catalogue = load_catalogue()
    assert catalogue.first_with(flag) == first
    assert catalogue.last_with(flag) == last
    inside = [v for v in catalogue.releases if version_key(first) <= version_key(v) <= version_key(last)]
    assert all(capabilities(v, catalogue).has(flag) for v in inside)


@pytest.mark.parametrize(
    ("version", "utilisation", "auto"),
    [
        ("0.10.0", 0.9, False),
        ("0.13.0", 0.9, False),
        ("0.14.0", 0.9, True),
        ("0.26.0", 0.92, True),
        ("0.33.0", 0.92, True),
    ],
)
def test_defaults_and_auto_length(version: str, utilisation: float, auto: bool) -> None:
    """The default utilisation (0.92 in 0.33, FACTS.md) and `--max-model-len auto` (from 0.14) per release."""
    caps = capabilities(version)
    assert caps.gpu_memory_utilization_default == utilisation
    assert caps.max_model_len_auto is auto


def test_every_fact_names_a_wheel_file() -> None:
    """Every fact and every flag group of every release names the vllm/ file it came from."""
    catalogue = load_catalogue()
    for version in catalogue.releases:
        entry = catalogue.entries[version]
        assert entry["wheel"].startswith(f"vllm-{version}-") and len(entry["wheel_sha256"]) == 64
        assert all(path.startswith("vllm/") for path in entry["flags"])
        for name, fact in entry["facts"].items():
            assert fact["source"].startswith("vllm/"), (version, name)


def test_dflash_appears_in_0_20() -> None:
    """DFlash is a speculative method from 0.20.0 (the seeds' "landed in 0.25" is stale); ngram is in every release."""
    assert "dflash" in capabilities("0.33.0").speculative_methods
    assert "dflash" in capabilities("0.20.0").speculative_methods
    assert "dflash" not in capabilities("0.19.1").speculative_methods
    assert all("ngram" in capabilities(v).speculative_methods for v in load_catalogue().releases)


@pytest.mark.parametrize(
    ("requested", "chosen", "warns"),
    [
        ("0.33.0", "0.33.0", False),
        ("0.10.1.1", "0.10.1.1", False),
        ("v0.26.0", "0.26.0", False),
        ("0.27.5", "0.27.1", True),
        ("0.35.0", "0.34.0", True),
        ("0.9.2", "0.34.0", True),
        ("latest", "0.34.0", True),
        (None, "0.34.0", True),
    ],
)
def test_version_resolution(requested: str | None, chosen: str, warns: bool) -> None:
    """A catalogued release is used as is; others use the same minor's nearest, else the newest, with a warning."""
    version, warnings = resolve_version(load_catalogue(), requested)
    assert version == chosen
    assert bool(warnings) is warns
    caps = capabilities(requested)
    assert caps.version == chosen and bool(caps.warnings) is warns


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("docker.io/vllm/vllm-openai:v0.33.0", "0.33.0"),
        ("vllm/vllm-openai:0.26.0-cu128", "0.26.0"),
        ("registry.local:5000/vllm-openai:v0.20.2", "0.20.2"),
        ("docker.io/vllm/vllm-openai:latest", None),
        ("registry.local:5000/vllm-openai", None),
        ("docker.io/vllm/vllm-openai@sha256:" + "a" * 64, None),
    ],
)
def test_version_from_image(image: str, version: str | None) -> None:
    """An image tag names the release; a tag without a number, or a digest, names none."""
    assert version_from_image(image) == version


def test_parse_version_ignores_longer_numbers() -> None:
    """Version parsing takes a whole release number, not a piece of a longer one."""
    assert parse_version("0.33.0") == "0.33.0"
    assert parse_version("build-12") is None


def test_fake_vllm_args_follow_the_fixed_schema() -> None:
    """The stand-in vLLM's argv grammar has the fixed schema and agrees with the 0.33 catalogue."""
    data = json.loads(FAKE_ARGS.read_text())
    assert set(data) == {"vllm_version", "source", "kv_cache_dtypes", "args"}
    assert data["vllm_version"] == "0.33.0"
    caps = capabilities("0.33.0")
    by_flag = {a["flag"]: a for a in data["args"]}
    for arg in data["args"]:
        assert set(arg) == {"flag", "kind", "choices", "aliases"}
        assert arg["kind"] in {"value", "switch", "list", "bool_optional"}
        assert arg["choices"] is None or all(isinstance(c, str) for c in arg["choices"])
        for option in (arg["flag"], *arg["aliases"]):
            assert caps.has(option), option
    assert set(caps.flags) == {o for a in data["args"] for o in (a["flag"], *a["aliases"])}
    assert by_flag["--numa-bind-nodes"]["kind"] == "list"
    assert by_flag["--numa-bind"]["kind"] == "bool_optional"
    assert by_flag["--enforce-eager"]["kind"] == "bool_optional"
    assert by_flag["--tensor-parallel-size"]["aliases"] == ["-tp"]
    assert by_flag["--kv-offloading-backend"]["choices"] == ["native", "lmcache"]
    assert by_flag["--kv-cache-dtype"]["choices"] is None  # 0.33 validates it in CacheConfig, after argparse
    assert data["kv_cache_dtypes"] == {"value": list(caps.kv_cache_dtypes), "source": "vllm/config/cache.py"}
    assert "--disable-prefix-caching" in by_flag["--enable-prefix-caching"]["aliases"]
