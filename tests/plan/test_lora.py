"""Tests for dankserve.plan.lora: adapter_config.json as hostile input, and the LoRA rules."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from dankserve.plan.lora import (
    MAX_ADAPTER_CONFIG_BYTES,
    AdapterConfigError,
    AdapterFacts,
    lora_sizing,
    lora_slot_bytes,
    max_cpu_loras,
    max_lora_rank,
    max_loras,
    parse_adapter_config,
)
from dankserve.plan.models import ModelFacts
from dankserve.plan.plan import plan_deployment
from dankserve.settings import DeploymentSettings
from tests.plan.builders import GIB, caps, gpu, host

LLAMA_1B = ModelFacts(
    model="test/llama-1b",
    parameter_bytes=2 * GIB,
    num_attention_heads=32,
    num_key_value_heads=8,
    num_hidden_layers=16,
    head_dim=64,
    max_position_embeddings=8192,
    dtype_bytes=2,
    hidden_size=2048,
    intermediate_size=8192,
)


def adapter(name: str, rank: int, size: int = 1 << 20) -> AdapterFacts:
    return AdapterFacts(name, f"/adapters/{name}", rank, ("q_proj", "v_proj"), size)


def config(**fields: object) -> bytes:
    return json.dumps({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], **fields}).encode()


def test_an_adapter_config_gives_rank_and_modules() -> None:
    """r and target_modules are read; a single module name is a list of one."""
    assert parse_adapter_config("a", config(r=64, target_modules="all-linear")) == (64, ("all-linear",))


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b"{", "not JSON"),
        (b"[]", "not a JSON object"),
        (b"[" * 100_000, "not JSON|over"),
        (b" " * (MAX_ADAPTER_CONFIG_BYTES + 1), "over"),
        (config(r=0), "rank r = 0"),
        (config(r=True), "rank r = True"),
        (config(r=10**30), "rank r"),
        (config(r="8"), "rank r"),
        (config(lora_alpha=None), "lora_alpha"),
        (config(target_modules=[]), "target_modules"),
        (config(target_modules=[1, 2]), "target_modules"),
        (config(peft_type="IA3"), "not LORA"),
        (config(use_dora=True), "DoRA"),
        (config(modules_to_save=["lm_head"]), "modules_to_save"),
    ],
)
def test_hostile_adapter_configs_are_refused(raw: bytes, problem: str) -> None:
    """Broken, huge, deeply nested or unsupported configs are refused with what is wrong."""
    with pytest.raises(AdapterConfigError, match=problem):
        parse_adapter_config("a", raw)


def test_rank_is_rounded_up_to_what_vllm_accepts() -> None:
    """The largest rank, rounded up to one of vLLM 0.26's --max-lora-rank choices, and why."""
    decision = max_lora_rank([adapter("a", 8), adapter("b", 24)])
    assert decision.value == 32
    assert "24 (b)" in decision.reason and "rounded up to 32" in decision.reason
    assert max_lora_rank([adapter("a", 16)]).value == 16


def test_slots_follow_the_adapters_up_to_a_cap() -> None:
    """One slot per adapter up to four; more adapters stay in CPU memory."""
    few = [adapter(str(i), 8) for i in range(3)]
    many = [adapter(str(i), 8) for i in range(6)]
    assert max_loras(few).value == 3 and max_cpu_loras(few, 3) is None
    assert max_loras(many).value == 4
    cpu = max_cpu_loras(many, 4)
    assert cpu is not None and cpu.value == 6


def test_slot_memory_is_rank_times_layer_sizes() -> None:
    """Slots x rank x (in + out) of qkv (3 A slices), o, gate_up (2 A slices), down x layers x dtype bytes."""
    found = lora_slot_bytes(LLAMA_1B, 2, 16)
    assert found is not None
    q, kv, hidden, inter = 32 * 64, 8 * 64, 2048, 8192
    per_layer = 16 * ((3 * hidden + q + 2 * kv) + (q + hidden) + (2 * hidden + 2 * inter) + (inter + hidden))
    assert found.value == 2 * per_layer * 16 * 2
    assert lora_slot_bytes(replace(LLAMA_1B, intermediate_size=None), 2, 16) is None


def test_the_plan_spells_the_lora_flags_with_reasons_and_counts_the_memory() -> None:
    """Adapters give --enable-lora, --max-loras, --max-lora-rank, --lora-modules, the runtime-update env and the slot
    memory in the fit (the KV capacity shrinks by it)."""
    dep = DeploymentSettings(model="test/llama-1b", adapters={"sql": "/srv/sql", "chat": "/srv/chat"})
    adapters = [adapter("sql", 8), adapter("chat", 16)]
    plain = plan_deployment("d", DeploymentSettings(model="test/llama-1b"), host(), caps("0.26.0"), LLAMA_1B)
    planned = plan_deployment("d", dep, host(), caps("0.26.0"), LLAMA_1B, adapters=adapters)
    argv = " ".join(planned.argv)
    assert "--enable-lora --max-loras 2 --max-lora-rank 16 --lora-modules sql=/adapters/sql chat=/adapters/chat" in argv
    assert planned.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    reasons = {f.flag: f.reason for f in planned.flags}
    assert "preallocated" in reasons["--max-loras"] and "16 (chat)" in reasons["--max-lora-rank"]
    slots = lora_sizing(adapters, LLAMA_1B).slot_bytes
    assert plain.capacity is not None and planned.capacity is not None
    assert plain.capacity.kv_cache_tokens is not None and planned.capacity.kv_cache_tokens is not None
    assert planned.capacity.kv_cache_tokens < plain.capacity.kv_cache_tokens
    assert planned.host_ram_bytes == plain.host_ram_bytes + 2 * (1 << 20)
    assert slots > 0
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in plain.env and "--enable-lora" not in plain.argv


def test_a_local_adapter_in_a_container_is_mounted() -> None:
    """A local directory's facts carry the host directory: the plan lists it as a read-only mount."""
    dep = DeploymentSettings(model="test/llama-1b", adapters={"sql": "/srv/sql"})
    facts = AdapterFacts("sql", "/dankserve/adapters/sql-x", 8, ("q_proj",), 0, host_dir="/srv/sql")
    planned = plan_deployment("d", dep, host(gpus=(gpu(),)), caps("0.26.0"), LLAMA_1B, adapters=[facts])
    assert planned.lora_mounts == (("/srv/sql", "/dankserve/adapters/sql-x"),)


def test_unknown_model_sizes_are_warned_about() -> None:
    """Without the model's hidden or intermediate size the slot memory is not counted, and the plan says so."""
    dep = DeploymentSettings(model="test/llama-1b", adapters={"sql": "/srv/sql"})
    facts = replace(LLAMA_1B, hidden_size=None)
    planned = plan_deployment("d", dep, host(), caps("0.26.0"), facts, adapters=[adapter("sql", 8)])
    assert any("LoRA slot memory not estimated" in w for w in planned.warnings)


def test_fingerprints_of_deployments_without_adapters_are_as_before_lora() -> None:
    """Without adapters the fingerprint hashes no LoRA key (servers planned before LoRA are still adopted);
    adapters change it."""
    from dankserve.plan.plan import _settings_payload

    plain = DeploymentSettings(model="test/llama-1b")
    assert "adapters" not in _settings_payload(plain)
    with_lora = plain.model_copy(update={"adapters": {"sql": "/srv/sql"}})
    a = plan_deployment("d", plain, host(), caps("0.26.0"), LLAMA_1B)
    b = plan_deployment("d", with_lora, host(), caps("0.26.0"), LLAMA_1B, adapters=[adapter("sql", 8)])
    assert a.fingerprint != b.fingerprint
