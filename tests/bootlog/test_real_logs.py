"""The boot-log reader on real vLLM 0.26.0 boot logs recorded on an H200 (issue 7's runs)."""

from pathlib import Path

import pytest

from dankserve.bootlog import read_boot_facts

REAL = Path(__file__).parent / "fixtures" / "real-0.26"


@pytest.mark.parametrize(
    ("log", "kv_bytes", "kv_gib", "hit", "tokens"),
    [
        ("dankserve_cold.log", 131805144576, 123.1, False, 4033760),
        ("manual_cold.log", 131805144576, 123.1, False, 4033760),
        ("warm_kill.log", 131868059136, 123.16, True, 4035680),
        ("down_up.log", 131805144576, None, True, 4022368),
        ("manual_best.log", 131805144576, None, True, 4022368),
    ],
)
def test_real_boots_give_their_facts(log: str, kv_bytes: int, kv_gib: float | None, hit: bool, tokens: int) -> None:
    """Each real boot yields its exact KV bytes, the KV GiB only when it profiled, and its compile-cache hit."""
    facts = read_boot_facts((REAL / log).read_text().splitlines())
    assert facts.vllm_version == "0.26.0"
    assert facts.ready is True and facts.failure is None
    assert facts.kv_cache_memory_bytes == kv_bytes
    assert facts.kv_cache_gib == kv_gib
    assert facts.compile_cache_hit is hit
    assert facts.gpu_kv_cache_tokens == tokens
    assert facts.compile_seconds is not None and facts.model_load_seconds is not None


PODMAN = Path(__file__).parent / "fixtures" / "real-0.26-podman"


@pytest.mark.parametrize(
    ("log", "kv_gib", "hit", "tokens"),
    [
        ("dankserve_cold.log", 123.1, False, 4033760),
        ("manual_cold.log", 123.1, False, 4033760),
        ("warm_kill.log", None, True, 4022368),
        ("down_up.log", None, True, 4022368),
        ("manual_best.log", None, True, 4022368),
    ],
)
def test_real_container_boots_read_from_their_k8s_file(log: str, kv_gib: float | None, hit: bool, tokens: int) -> None:
    """Real vLLM 0.26.0 in a Podman container on the H200: its k8s-file log, as the daemon reads it, gives the facts."""
    from dankserve.runtime.logfile import k8s_file_lines

    facts = read_boot_facts(list(k8s_file_lines((PODMAN / log).read_bytes().splitlines())))
    assert facts.vllm_version == "0.26.0"
    assert facts.ready is True and facts.failure is None
    assert facts.kv_cache_memory_bytes == 131805144576
    assert facts.kv_cache_gib == kv_gib
    assert facts.compile_cache_hit is hit
    assert facts.gpu_kv_cache_tokens == tokens
