"""Tests for dankserve.supervisor.learning: fingerprints, the free-memory guard, what a boot teaches."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from dankserve.bootlog import BootFacts, FailureClass, read_boot_facts
from dankserve.host.model import GpuIdentity
from dankserve.state import LearnedKv, keep_first
from dankserve.supervisor.learning import (
    MemoryFlags,
    boot_fingerprint,
    decide_kv_reuse,
    kv_shrink_warning,
    learn_from_boot,
)

FIXTURES = Path(__file__).resolve().parents[1] / "bootlog" / "fixtures"
GIB = 2**30
H200 = GpuIdentity("NVIDIA H200", 143771090944)
ARGV = ("m", "--max-model-len", "4096", "--gpu-memory-utilization=0.92", "--kv-cache-dtype", "fp8")


def fingerprint(**changes: object) -> str:
    base: dict[str, object] = {
        "vllm": "sha256:abc",
        "model": "meta-llama/Llama-3.2-1B-Instruct",
        "revision": None,
        "gpus": (H200,),
        "flags": MemoryFlags.from_argv(ARGV),
    }
    base.update(changes)
    return boot_fingerprint(**base)  # type: ignore[arg-type]


def test_fingerprint_is_stable() -> None:
    """The same inputs give the same fingerprint (it is persisted across daemon restarts)."""
    assert fingerprint() == fingerprint()
    assert fingerprint().startswith("kv1-")


@pytest.mark.parametrize(
    "changes",
    [
        {"vllm": "sha256:def"},
        {"model": "Qwen/Qwen2.5-7B-Instruct"},
        {"revision": "main"},
        {"gpus": (GpuIdentity("NVIDIA H100 80GB HBM3", 85520809984),)},
        {"gpus": (H200, H200)},
        {"flags": MemoryFlags.from_argv((*ARGV, "--max-num-seqs", "64"))},
        {"flags": MemoryFlags.from_argv((*ARGV, "--enforce-eager"))},
        {"flags": MemoryFlags.from_argv((*ARGV, "--speculative-config", '{"method":"ngram"}'))},
        {"flags": MemoryFlags.from_argv((*ARGV, "--kv-offloading-size", "64"))},
        {"flags": MemoryFlags.from_argv((*ARGV, "--cpu-offload-gb", "8"))},
        {"flags": MemoryFlags.from_argv((*ARGV, "-tp", "2"))},
        {"flags": MemoryFlags.from_argv((*ARGV, "--max-num-batched-tokens", "16384"))},
        {"flags": MemoryFlags.from_argv((*ARGV, "-O3"))},
    ],
    ids=lambda changes: next(iter(changes)) if isinstance(changes, dict) else str(changes),
)
def test_fingerprint_changes_with_each_input(changes: dict[str, object]) -> None:
    """Every input that decides the KV bytes changes the fingerprint."""
    assert fingerprint(**changes) != fingerprint()


def test_fingerprint_ignores_other_flags_and_kv_bytes() -> None:
    """Flags that do not change memory, and the learned bytes themselves, leave the fingerprint alone."""
    flags = MemoryFlags.from_argv((*ARGV, "--port", "8001", "--kv-cache-memory-bytes", "123", "--api-key", "x"))
    assert fingerprint(flags=flags) == fingerprint()


def test_memory_flags_from_argv() -> None:
    """Both spellings and `=` forms are read; the last occurrence wins as in argparse."""
    flags = MemoryFlags.from_argv(
        ["m", "--max_model_len", "8192", "--tensor-parallel-size=2", "--enforce-eager", "--max-model-len=4096"]
    )
    assert (flags.max_model_len, flags.tensor_parallel_size, flags.enforce_eager) == ("4096", "2", True)


LEARNED = LearnedKv(132530194268, (139 * GIB, 139 * GIB), 1_764_000_000.0, "0.33.0")


@pytest.mark.parametrize(
    ("free_now", "reused"),
    [
        ((139 * GIB, 139 * GIB), True),
        ((140 * GIB, 139 * GIB), True),
        ((-(-139 * GIB * 99 // 100), 139 * GIB), True),
        ((-(-139 * GIB * 99 // 100) - 1, 139 * GIB), False),
        ((139 * GIB, 100 * GIB), False),
        ((139 * GIB,), False),
    ],
    ids=["same", "more", "exactly-99", "just-below-99", "second-gpu-busy", "gpu-count-changed"],
)
def test_reuse_guard(free_now: tuple[int, ...], reused: bool) -> None:
    """Learned bytes are reused only with >= 99 % of the baseline free memory on every GPU."""
    decision = decide_kv_reuse(LEARNED, free_now)
    assert (decision.use_bytes == LEARNED.kv_cache_memory_bytes) is reused
    assert decision.use_bytes is None or reused
    assert decision.reason


def test_reuse_guard_names_the_short_gpu() -> None:
    """When profiling is needed the reason names the GPU and both amounts."""
    decision = decide_kv_reuse(LEARNED, (139 * GIB, 100 * GIB))
    assert "GPU 1" in decision.reason and "100.00 GiB" in decision.reason and "139.00 GiB" in decision.reason


def test_nothing_learned_profiles() -> None:
    """Without a learned value the boot profiles, and says so."""
    decision = decide_kv_reuse(None, (139 * GIB,))
    assert decision.use_bytes is None and "no KV size learned" in decision.reason


def facts(name: str) -> BootFacts:
    return read_boot_facts((FIXTURES / name).read_text(encoding="utf-8").split("\n"))


def test_learn_from_profiled_ready_boot() -> None:
    """A profiled boot that became ready teaches its suggested bytes and the baseline."""
    learned = learn_from_boot(facts("v033_cold.log"), [139 * GIB], 1_764_000_000.0)
    assert learned == LearnedKv(132530194268, (139 * GIB,), 1_764_000_000.0, "0.33.0", kv_cache_tokens=3986816)


@pytest.mark.parametrize(
    "boot",
    [
        facts("v033_learned_bytes.log"),  # given bytes: nothing new
        facts("fail_oom_load.log"),
        replace(facts("v033_cold.log"), ready=False),
        replace(facts("v033_cold.log"), failure=FailureClass.ENGINE_DEAD),
    ],
    ids=["given-bytes", "failed", "not-ready", "failure"],
)
def test_nothing_learned_from_other_boots(boot: BootFacts) -> None:
    """Boots that did not profile, or did not become ready cleanly, teach nothing."""
    assert learn_from_boot(boot, [139 * GIB], 0.0) is None


def test_first_value_kept() -> None:
    """A later boot's different suggestion never replaces the first learned value."""
    later = replace(LEARNED, kv_cache_memory_bytes=132470186412, learned_at=1_764_100_000.0)
    assert keep_first(LEARNED, later) is LEARNED
    assert keep_first(None, later) is later


def test_learned_json_round_trip() -> None:
    """A learned entry survives its JSON form; a malformed one is rejected."""
    assert LearnedKv.from_json(LEARNED.to_json()) == LEARNED
    with pytest.raises(ValueError):
        LearnedKv.from_json({**LEARNED.to_json(), "kv_cache_memory_bytes": -1})
    with pytest.raises(ValueError):
        LearnedKv.from_json({**LEARNED.to_json(), "baseline_free_bytes": ["x"]})


def test_a_kv_cache_more_than_one_percent_smaller_is_reported_with_the_size_that_fixes_it() -> None:
    """kv_shrink_warning names the token counts and the bytes that would hold the profiled count."""
    learned = LearnedKv(1000, (1,), 0.0, "0.33.0", kv_cache_tokens=1000)
    message = kv_shrink_warning(learned, 900)
    assert message is not None and "900 tokens" in message and "need 1112 bytes" in message
    assert kv_shrink_warning(learned, 991) is None
    assert kv_shrink_warning(replace(learned, kv_cache_tokens=None), 10) is None
    assert kv_shrink_warning(learned, None) is None


def test_learned_tokens_survive_the_state_file() -> None:
    """The profiled boot's token count is written and read back; an old entry without it reads as None."""
    learned = LearnedKv(1000, (1,), 0.0, "0.26.0", kv_cache_tokens=4125376)
    assert LearnedKv.from_json(learned.to_json()) == learned
    old = learned.to_json()
    del old["kv_cache_tokens"]
    assert LearnedKv.from_json(old).kv_cache_tokens is None
