"""Tests for dankserve.plan.plan: the seeds' example commands as golden plans, and the plan's invariants."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from dankserve.errors import ConfigError, InfeasiblePlan, UnknownValueError
from dankserve.plan.catalogue import load_catalogue
from dankserve.plan.models import ModelFacts, declared_facts
from dankserve.plan.plan import plan_deployment
from dankserve.plan.types import Plan
from dankserve.settings import DeploymentSettings, Settings, load_settings
from tests.plan.builders import GIB, LLAMA_70B, PLAN_JSON_KEYS, QWEN3_30B, caps, gpu, host, recorded

EXAMPLE = Path(__file__).resolve().parent.parent.parent / "config" / "dankserve.toml"
BASE_ENV = {
    "VLLM_CACHE_ROOT": "/root/.cache/vllm",
    "TRITON_CACHE_DIR": "/root/.cache/vllm/triton",
    "FLASHINFER_WORKSPACE_BASE": "/root/.cache/vllm/flashinfer",
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "NO_COLOR": "1",
    "VLLM_DISABLE_LOG_LOGO": "1",
}


def example() -> Settings:
    return load_settings(EXAMPLE, environ={})


def plan_example(name: str, host_name: str, version: str = "0.33.0", learned: int | None = None) -> Plan:
    dep = example().deployments[name]
    assert dep.model_facts is not None
    facts = declared_facts(dep.model, dep.model_facts)
    return plan_deployment(
        name,
        dep,
        recorded(host_name),
        caps(version),
        facts,
        catalogue=load_catalogue(),
        learned_kv_cache_memory_bytes=learned,
    )


# The seeds' example commands (Hybrid CPU GPU Processing; vLLM research findings), planned for
# vLLM 0.33 on the hosts they describe. Differences from the seed text are vLLM 0.33's
# spelling (--kv-offloading-size for --swap-space) and what the rules add (reasons in docs/planner.md),
# among them the model family's parsers (Qwen3: qwen3 reasoning, hermes tools; Llama 3.1: llama3_json)
# and keeping dankserve's probes out of the access log.
GOLDEN = [
    (
        # vllm serve Qwen/Qwen3-30B-A3B --gpu-memory-utilization 0.85 --swap-space 16
        #   --max-num-batched-tokens 4096 --max-num-seqs 128
        "qwen3-30b",
        "plan-a100-80gb-x1-64gb",
        "Qwen/Qwen3-30B-A3B --tensor-parallel-size 1 --gpu-memory-utilization 0.85 --kv-cache-dtype auto "
        "--kv-offloading-size 16 --kv-offloading-backend native --max-num-batched-tokens 4096 --max-num-seqs 128 "
        "--reasoning-parser qwen3 --enable-auto-tool-choice --tool-call-parser hermes "
        "--disable-access-log-for-endpoints /health,/metrics,/ping",
        {},
    ),
    (
        # vllm serve Qwen/Qwen3-30B-A3B-FP8 --kv-cache-dtype fp8 --gpu-memory-utilization 0.9
        #   --swap-space 16 --max-num-batched-tokens 8192
        "qwen3-30b-fp8",
        "plan-h100-80gb-x1-64gb",
        "Qwen/Qwen3-30B-A3B-FP8 --tensor-parallel-size 1 --gpu-memory-utilization 0.9 --kv-cache-dtype fp8 "
        "--kv-offloading-size 16 --kv-offloading-backend native --max-num-batched-tokens 8192 --max-num-seqs 128 "
        "--reasoning-parser qwen3 --enable-auto-tool-choice --tool-call-parser hermes "
        "--disable-access-log-for-endpoints /health,/metrics,/ping",
        {},
    ),
    (
        # vllm serve meta-llama/Llama-3.1-70B-Instruct --tensor-parallel-size 4 --gpu-memory-utilization 0.9
        #   --swap-space 32 --max-model-len 8192; NUMA: --numa-bind --numa-bind-nodes 0 0 1 1
        "llama-70b",
        "plan-h100-80gb-x4-2numa-128gb",
        "meta-llama/Llama-3.1-70B-Instruct --tensor-parallel-size 4 --gpu-memory-utilization 0.9 "
        "--max-model-len 8192 --kv-cache-dtype fp8 --kv-offloading-size 32 --kv-offloading-backend native "
        "--max-num-batched-tokens 8192 --max-num-seqs 128 --enable-auto-tool-choice --tool-call-parser llama3_json "
        "--disable-access-log-for-endpoints /health,/metrics,/ping --numa-bind --numa-bind-nodes 0 0 1 1",
        {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"},
    ),
    (
        # vllm serve Qwen/Qwen3.6-35B-A3B --spec-method dflash --spec-model z-lab/Qwen3.6-35B-A3B-DFlash
        #   --spec-tokens 8 --kv-cache-dtype fp8 --max-num-seqs 32 --tensor-parallel-size 1
        #   --gpu-memory-utilization 0.9
        "qwen36-dflash",
        "plan-h200-141gb-x1-256gb",
        "Qwen/Qwen3.6-35B-A3B --tensor-parallel-size 1 --gpu-memory-utilization 0.9 --kv-cache-dtype fp8 "
        "--kv-offloading-size 64 --kv-offloading-backend native --max-num-batched-tokens 8192 --max-num-seqs 32 "
        '--speculative-config {"method":"dflash","model":"z-lab/Qwen3.6-35B-A3B-DFlash","num_speculative_tokens":8}'
        " --disable-access-log-for-endpoints /health,/metrics,/ping",
        {},
    ),
]


@pytest.mark.parametrize(("name", "host_name", "argv", "env"), GOLDEN, ids=[g[0] for g in GOLDEN])
def test_seed_examples_as_golden_plans(name: str, host_name: str, argv: str, env: dict[str, str]) -> None:
    """Each seed example command, configured in config/dankserve.toml, plans to the expected argv and env."""
    plan = plan_example(name, host_name)
    assert list(plan.argv) == argv.split(" ")
    assert dict(plan.env) == {**BASE_ENV, **env}
    assert all(f.reason for f in plan.flags)
    assert plan.numa_bind is bool(env)


def test_seed_example_on_an_old_release_uses_swap_space() -> None:
    """vLLM 0.11.0 has no --kv-offloading-size: the seed's --swap-space 16 comes back."""
    plan = plan_example("qwen3-30b", "plan-a100-80gb-x1-64gb", version="0.11.0")
    assert "--swap-space 16" in " ".join(plan.argv)
    assert "--kv-offloading-size" not in plan.argv


def test_numa_on_a_release_without_it_is_a_warning() -> None:
    """Automatic NUMA binding on vLLM 0.19 is left out with a warning, not an error."""
    plan = plan_example("llama-70b", "plan-h100-80gb-x4-2numa-128gb", version="0.19.1")
    assert "--numa-bind" not in plan.argv and not plan.numa_bind
    assert any("no --numa-bind" in w for w in plan.warnings)
    assert "VLLM_WORKER_MULTIPROC_METHOD" not in plan.env


def test_configured_numa_on_a_release_without_it_is_infeasible() -> None:
    """numa_bind = true on vLLM 0.19 exits 4: the flag does not exist there."""
    dep = example().deployments["llama-70b"].model_copy(update={"numa_bind": True})
    with pytest.raises(InfeasiblePlan, match="--numa-bind"):
        plan_deployment("l", dep, recorded("plan-h100-80gb-x4-2numa-128gb"), caps("0.19.1"), LLAMA_70B)


def test_learned_kv_bytes_are_passed_and_keep_the_fingerprint() -> None:
    """A learned KV size adds --kv-cache-memory-bytes; the fingerprint does not change with it."""
    first = plan_example("qwen3-30b-fp8", "plan-h100-80gb-x1-64gb")
    later = plan_example("qwen3-30b-fp8", "plan-h100-80gb-x1-64gb", learned=40_123_456_789)
    assert later.argv[later.argv.index("--kv-cache-memory-bytes") + 1] == "40123456789"
    assert "--kv-cache-memory-bytes" not in first.argv
    assert later.fingerprint == first.fingerprint


def test_learned_kv_bytes_on_a_release_without_the_flag_warn() -> None:
    """vLLM 0.10.0 lacks --kv-cache-memory-bytes: the learned size is dropped with a warning."""
    plan = plan_example("qwen3-30b", "plan-a100-80gb-x1-64gb", version="0.10.0", learned=10)
    assert "--kv-cache-memory-bytes" not in plan.argv
    assert any("--kv-cache-memory-bytes" in w for w in plan.warnings)


def test_fingerprint_ignores_live_free_memory() -> None:
    """Free GPU memory and available RAM do not change the fingerprint; the model and GPU totals do."""
    the_host = recorded("plan-h100-80gb-x1-64gb")
    dep = DeploymentSettings(model="Qwen/Qwen3-30B-A3B")
    base = plan_deployment("d", dep, the_host, caps(), QWEN3_30B)
    busier = the_host.model_copy(
        update={
            "gpus": tuple(g.model_copy(update={"memory_free_bytes": 1}) for g in the_host.gpus),
            "memory": the_host.memory.model_copy(update={"available_bytes": 40 * GIB}),
        }
    )
    assert plan_deployment("d", dep, busier, caps(), QWEN3_30B).fingerprint == base.fingerprint
    other_model = replace(QWEN3_30B, parameter_bytes=QWEN3_30B.parameter_bytes + 1)  # type: ignore[operator]
    assert plan_deployment("d", dep, the_host, caps(), other_model).fingerprint != base.fingerprint
    assert (
        plan_deployment("d", dep, host(gpus=(gpu(memory_gib=141),)), caps(), QWEN3_30B).fingerprint != base.fingerprint
    )


def test_extra_args_come_last_verbatim() -> None:
    """extra_args follow every planned flag, unchanged; unknown ones are warned about."""
    dep = DeploymentSettings(model="m", extra_args=["--enable-prefix-caching", "--no-such-flag", "x"])
    plan = plan_deployment("d", dep, host(), caps(), QWEN3_30B)
    assert list(plan.argv[-3:]) == ["--enable-prefix-caching", "--no-such-flag", "x"]
    assert any("--no-such-flag" in w and "--enable-prefix-caching" not in w for w in plan.warnings)


def test_served_model_name_is_passed_with_its_reason() -> None:
    """served_model_name becomes --served-model-name (the name clients and the gateway use); unset: no flag."""
    dep = DeploymentSettings(model="org/m", served_model_name="chat")
    plan = plan_deployment("d", dep, host(), caps(), QWEN3_30B)
    index = plan.argv.index("--served-model-name")
    assert plan.argv[index + 1] == "chat"
    assert (
        "--served-model-name" not in plan_deployment("d", DeploymentSettings(model="m"), host(), caps(), QWEN3_30B).argv
    )


def test_a_swap_group_member_gets_sleep_mode_and_dev_mode_where_the_release_has_it() -> None:
    """swap_group adds --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1; with sleep_level = stop neither."""
    dep = DeploymentSettings(model="m", swap_group="g", gpu_memory_utilization=0.9)
    plan = plan_deployment("d", dep, host(), caps(), QWEN3_30B)
    assert "--enable-sleep-mode" in plan.argv and plan.env["VLLM_SERVER_DEV_MODE"] == "1"
    stopped = plan_deployment("d", dep.model_copy(update={"sleep_level": "stop"}), host(), caps(), QWEN3_30B)
    assert "--enable-sleep-mode" not in stopped.argv and "VLLM_SERVER_DEV_MODE" not in stopped.env
    old = caps("0.8.5")
    if not old.has("--enable-sleep-mode"):
        warned = plan_deployment("d", dep, host(), old, QWEN3_30B)
        assert any("stopping it and booting it again" in w for w in warned.warnings)


def test_snapshot_auto_gets_sleep_mode_so_the_capture_empties_the_gpu_first() -> None:
    """Found on an H100: without sleep mode an 8B's capture held its weights and KV cache (74 GB). On a private
    socket: sleep mode and dev mode (the capture sleeps it at level 2); on TCP: sleep mode alone where 0.34's
    checkpoint routes exist (no dev mode: its routes would be open to every local user), else a note; none
    for snapshot = "off" or TP > 1 (no snapshot there)."""
    dep = DeploymentSettings(model="m", gpu_memory_utilization=0.9)
    private = plan_deployment("d", dep, host(), caps(), QWEN3_30B, socket="/s/vllm.sock")
    assert "--enable-sleep-mode" in private.argv and private.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert any(c.flag == "--enable-sleep-mode" and "level 2" in c.reason for c in private.flags)
    assert private.exposure is not None and private.exposure.private and private.exposure.dev_mode
    tcp = plan_deployment("d", dep, host(), caps("0.33.0"), QWEN3_30B)
    assert "--enable-sleep-mode" not in tcp.argv and "VLLM_SERVER_DEV_MODE" not in tcp.env
    assert any("cannot sleep it" in n and 'listen = "socket"' in n for n in tcp.notes)
    routes = plan_deployment("d", dep, host(), caps("0.34.0"), QWEN3_30B)
    assert "--enable-sleep-mode" in routes.argv and "VLLM_SERVER_DEV_MODE" not in routes.env
    assert not any("cannot sleep it" in n for n in routes.notes)
    for other in (dep.model_copy(update={"snapshot": "off"}), dep.model_copy(update={"tensor_parallel_size": 2})):
        plain = plan_deployment("d", other, host(gpus=(gpu(0), gpu(1))), caps(), QWEN3_30B, socket="/s/vllm.sock")
        assert "--enable-sleep-mode" not in plain.argv and "VLLM_SERVER_DEV_MODE" not in plain.env


def test_a_swap_group_member_keeps_is_sleeping_polls_out_of_its_access_log() -> None:
    """Every sleep and wake polls /is_sleeping (44 % of a group's lines, issue 39 item 12): a sleeping member's
    access log leaves it out as it does /health; others (no dev-mode routes) keep the plain list."""
    dep = DeploymentSettings(model="m", swap_group="g", gpu_memory_utilization=0.9)
    member = plan_deployment("d", dep, host(), caps(), QWEN3_30B)
    flag = member.argv.index("--disable-access-log-for-endpoints")
    assert member.argv[flag + 1] == "/health,/metrics,/ping,/is_sleeping"
    alone = plan_deployment("d", DeploymentSettings(model="m"), host(), caps(), QWEN3_30B)
    assert alone.argv[alone.argv.index("--disable-access-log-for-endpoints") + 1] == "/health,/metrics,/ping"


def test_cpu_offload_flags_and_latency_warning() -> None:
    """cpu_offload adds --cpu-offload-gb and --cpu-offload-params (a list) and warns about latency."""
    dep = DeploymentSettings(model="m", cpu_offload={"gib": 16, "params": ["experts", "lm_head"]})
    plan = plan_deployment("d", dep, host(), caps(), QWEN3_30B)
    text = " ".join(plan.argv)
    assert "--cpu-offload-gb 16 --cpu-offload-params experts lm_head" in text
    assert any("latency" in w for w in plan.warnings)
    with pytest.raises(InfeasiblePlan, match="--cpu-offload-params"):
        plan_deployment("d", dep, host(), caps("0.16.0"), QWEN3_30B)


def test_cpu_offload_makes_room_for_weights() -> None:
    """Weights that do not fit fit once enough of them are offloaded to CPU memory."""
    big = replace(QWEN3_30B, parameter_bytes=90 * GIB)
    with pytest.raises(InfeasiblePlan, match="does not fit"):
        plan_deployment("d", DeploymentSettings(model="m"), host(), caps(), big)
    dep = DeploymentSettings(model="m", cpu_offload={"gib": 30})
    assert plan_deployment("d", dep, host(), caps(), big).tensor_parallel_size == 1


def test_unknown_model_facts_skip_checks_with_a_warning() -> None:
    """An unknown model gets no fit checks, a warning naming the missing facts, and all GPUs."""
    plan = plan_deployment(
        "d", DeploymentSettings(model="org/x"), host(gpus=(gpu(0), gpu(1))), caps(), ModelFacts("org/x")
    )
    assert plan.tensor_parallel_size == 2
    assert any("model facts unknown" in w and "parameter_bytes" in w for w in plan.warnings)
    assert "--max-model-len" not in plan.argv


def test_long_native_context_becomes_auto() -> None:
    """Llama's 131072-token context does not fit beside its weights on 2 H100s: auto (0.33), a number (0.13)."""
    dep = DeploymentSettings(model="l", tensor_parallel_size=2, kv_cache_dtype="auto")
    the_host = host(gpus=(gpu(0), gpu(1)))
    plan = plan_deployment("d", dep, the_host, caps(), LLAMA_70B)
    assert plan.argv[plan.argv.index("--max-model-len") + 1] == "auto"
    old = plan_deployment("d", dep, the_host, caps("0.13.0"), LLAMA_70B)
    length = int(old.argv[old.argv.index("--max-model-len") + 1])
    assert 0 < length < 131072 and length % 16 == 0


def test_configured_context_that_cannot_fit_is_infeasible() -> None:
    """A configured max_model_len whose KV cannot fit exits 4 before anything starts."""
    dep = DeploymentSettings(model="l", tensor_parallel_size=2, kv_cache_dtype="auto", max_model_len=131072)
    with pytest.raises(InfeasiblePlan, match="max_model_len 131072"):
        plan_deployment("d", dep, host(gpus=(gpu(0), gpu(1))), caps(), LLAMA_70B)


def test_tp_chosen_for_a_configured_context() -> None:
    """With a long configured context, TP grows until one sequence's KV fits too."""
    dep = DeploymentSettings(model="l", kv_cache_dtype="auto", max_model_len=131072)
    plan = plan_deployment("d", dep, recorded("plan-h100-80gb-x4-2numa-128gb"), caps(), LLAMA_70B)
    assert plan.tensor_parallel_size == 4


def test_fewer_gpus_than_assigned_are_used_and_said() -> None:
    """A model that fits on one of four GPUs uses GPU 0 only and warns that three are unused."""
    plan = plan_deployment(
        "d", DeploymentSettings(model="q"), recorded("plan-h100-80gb-x4-2numa-128gb"), caps(), QWEN3_30B
    )
    assert plan.gpu_indices == (0,)
    assert plan.argv[plan.argv.index("--numa-bind-nodes") + 1 :] == ("0",)  # one entry: the one GPU used
    assert any("uses 1 of the 4" in w for w in plan.warnings)


def test_desktop_host_warnings() -> None:
    """An RTX 4090 with 6 cores plans at 0.70 with fp8 (SM 8.9) and warns about the cores."""
    small = replace(QWEN3_30B, model="q", parameter_bytes=8 * GIB)
    plan = plan_deployment("d", DeploymentSettings(model="q"), recorded("plan-rtx4090-x1-6core-32gb"), caps(), small)
    assert "--gpu-memory-utilization 0.7 --kv-cache-dtype fp8 --kv-offloading-size 8" in " ".join(plan.argv)
    assert any("6 physical CPU cores" in w for w in plan.warnings)


def test_mig_and_unknown_numa_nodes() -> None:
    """MIG on an assigned GPU is warned about; GPUs without a known NUMA node get --numa-bind alone."""
    dep = DeploymentSettings(model="q", tensor_parallel_size=2)
    plan = plan_deployment(
        "d", dep, recorded("plan-a100-40gb-x2-mig"), caps(), replace(QWEN3_30B, parameter_bytes=20 * GIB)
    )
    assert "--numa-bind" in plan.argv and "--numa-bind-nodes" not in plan.argv
    assert any("MIG" in w for w in plan.warnings)


def test_invalid_inputs_exit_2() -> None:
    """q8_0 and a GPU the host lacks are invalid input."""
    with pytest.raises(UnknownValueError, match="q8_0"):
        plan_deployment("d", DeploymentSettings(model="q", kv_cache_dtype="q8_0"), host(), caps(), QWEN3_30B)
    with pytest.raises(ConfigError, match="GPU 7"):
        plan_deployment("d", DeploymentSettings(model="q", gpus=[7]), host(), caps(), QWEN3_30B)


def test_process_runtime_binds_host_and_port() -> None:
    """The process runtime gets --host and --port; a container maps its port instead."""
    dep = DeploymentSettings(
        model="q", runtime="process", host="0.0.0.0", port=8123, api_key_file=Path("/etc/dankserve/d.key")
    )
    plan = plan_deployment("d", dep, host(), caps(), QWEN3_30B, vllm_cache_root="/var/cache/dankserve/d/vllm")
    assert list(plan.argv[-4:]) == ["--host", "0.0.0.0", "--port", "8123"]
    assert plan.env["VLLM_CACHE_ROOT"] == "/var/cache/dankserve/d/vllm"


def test_unknown_version_plans_for_the_newest_with_a_warning() -> None:
    """A release newer than the catalogue plans with the newest's flags and says so."""
    plan = plan_deployment("d", DeploymentSettings(model="q"), host(), caps("0.40.0"), QWEN3_30B)
    assert plan.vllm_version == "0.34.0"
    assert any("0.40.0" in w for w in plan.warnings)


def test_plan_json_shape() -> None:
    """to_json has exactly the documented keys, argv as separate tokens and flag values as lists for lists."""
    plan = plan_example("llama-70b", "plan-h100-80gb-x4-2numa-128gb")
    data = plan.to_json()
    assert list(data) == PLAN_JSON_KEYS
    assert data["argv"][-5:] == ["--numa-bind-nodes", "0", "0", "1", "1"]
    nodes = next(f for f in data["flags"] if f["flag"] == "--numa-bind-nodes")
    assert nodes["value"] == ["0", "0", "1", "1"]
    assert next(f for f in data["flags"] if f["flag"] == "--numa-bind")["value"] is None
    assert all(set(f) == {"flag", "value", "reason"} for f in data["flags"])


def test_attention_backend_flag_or_legacy_env() -> None:
    """A configured backend is --attention-backend from 0.13, VLLM_ATTENTION_BACKEND before; auto adds nothing."""
    dep = DeploymentSettings(model="q", attention_backend="flashinfer")
    new = plan_deployment("d", dep, host(), caps(), QWEN3_30B)
    assert "--attention-backend FLASHINFER" in " ".join(new.argv) and "VLLM_ATTENTION_BACKEND" not in new.env
    old = plan_deployment("d", dep, host(), caps("0.12.0"), QWEN3_30B)
    assert "--attention-backend" not in old.argv and old.env["VLLM_ATTENTION_BACKEND"] == "FLASHINFER"
    auto = plan_deployment("d", DeploymentSettings(model="q", attention_backend="auto"), host(), caps(), QWEN3_30B)
    assert "--attention-backend" not in auto.argv


def test_non_positive_offload_is_invalid_input() -> None:
    """kv_offload must be a positive GiB amount (or auto/off): exit 2."""
    with pytest.raises(ConfigError, match="kv_offload"):
        plan_deployment("d", DeploymentSettings(model="q", kv_offload=0), host(), caps(), QWEN3_30B)
