"""vLLM 0.26, 0.33 and 0.34 planned side by side (issue 42): what each release's catalogue facts change.

Removed flags and variables are refused naming the release that removed them and the replacement; the
learned KV bytes say what they turn off in 0.34; vLLM's admission follows the gateway's queue; the first
boot of a release with `vllm download-kernels` installs the kernels into the kept cache dir."""

from __future__ import annotations

import pytest

from dankserve.errors import ConfigError
from dankserve.plan.catalogue import load_catalogue, version_key
from dankserve.plan.plan import plan_deployment
from dankserve.plan.releases import GatewayQueue
from dankserve.plan.types import Plan
from dankserve.settings import DeploymentSettings
from tests.plan.builders import GIB, QWEN3_30B, caps, host

RELEASES = ("0.26.0", "0.33.0", "0.34.0")
GATEWAY = GatewayQueue(max_in_flight=None, queue_size=64)


def plan(
    version: str,
    learned: int | None = None,
    gateway: GatewayQueue | None = GATEWAY,
    **settings: object,
) -> Plan:
    deployment = DeploymentSettings.model_validate({"model": "q", **settings})
    return plan_deployment(
        "d",
        deployment,
        host(),
        caps(version),
        QWEN3_30B,
        learned_kv_cache_memory_bytes=learned,
        catalogue=load_catalogue(),
        gateway=gateway,
    )


def flag(p: Plan, name: str) -> str | None:
    return next((c.reason for c in p.flags if c.flag == name), None)


def test_three_releases_side_by_side() -> None:
    """One deployment on 0.26, 0.33 and 0.34: the same sizing; admission, kernels and KV sizing by release."""
    first = {v: plan(v) for v in RELEASES}
    warm = {v: plan(v, learned=40 * GIB) for v in RELEASES}
    # The same model, GPUs and sizing on every release.
    assert len({p.gpu_memory_utilization for p in first.values()}) == 1
    assert len({p.tensor_parallel_size for p in first.values()}) == 1
    # --max-num-queued-reqs is 0.29+: 0.26 has none; 0.33 and 0.34 follow the gateway's queue.
    assert "--max-num-queued-reqs" not in first["0.26.0"].argv
    for version in ("0.33.0", "0.34.0"):
        argv = list(first[version].argv)
        seqs = int(argv[argv.index("--max-num-seqs") + 1])
        assert argv[argv.index("--max-num-queued-reqs") + 1] == str(seqs + 64)
        assert "holds 64 more" in (flag(first[version], "--max-num-queued-reqs") or "")
    # `vllm download-kernels` is 0.32+: the first boot of 0.33 and 0.34 runs it into the kept cache dir.
    assert first["0.26.0"].kernels is None
    for version in ("0.33.0", "0.34.0"):
        kernels = first[version].kernels
        assert kernels is not None and kernels.argv == ("download-kernels",)
        assert kernels.target == f"/root/.cache/vllm/kernels/{version}" and kernels.env == {
            "PIP_TARGET": kernels.target
        }
        assert any("download-kernels" in n and "kept cache dir" in n for n in first[version].notes)
        later = warm[version].kernels  # a later boot: the kernels are kept, put on PYTHONPATH, not fetched
        assert later is not None and not later.download and later.target == kernels.target
        assert not any("download-kernels" in n for n in warm[version].notes)
    # KV sizing: 0.34 sizes the KV cache itself on the first boot (extensible), and the plan says so.
    assert not any("extensible" in n for n in first["0.33.0"].notes + first["0.26.0"].notes)
    assert any("extensible KV cache" in n for n in first["0.34.0"].notes)
    for version in RELEASES:
        assert "--kv-cache-memory-bytes" in warm[version].argv
    assert "extensible" not in (flag(warm["0.33.0"], "--kv-cache-memory-bytes") or "")
    reason = flag(warm["0.34.0"], "--kv-cache-memory-bytes") or ""
    assert "turns off its extensible KV cache" in reason and "skips the profiling run" in reason
    assert "notes" in warm["0.34.0"].to_json()


def test_no_gateway_leaves_vllm_admission_alone() -> None:
    """Without a gateway there is no queue to agree with: vLLM's default (no limit) stays."""
    assert "--max-num-queued-reqs" not in plan("0.34.0", gateway=None).argv


def test_gateway_cap_sets_the_admission_limit() -> None:
    """The gateway's max_in_flight, not --max-num-seqs, is what it passes at once."""
    argv = list(plan("0.34.0", gateway=GatewayQueue(max_in_flight=8, queue_size=4)).argv)
    assert argv[argv.index("--max-num-queued-reqs") + 1] == "12"


@pytest.mark.parametrize(
    ("version", "extra", "removed_in", "fix"),
    [
        ("0.33.0", ["--calculate-kv-scales"], "0.28.0", "the checkpoint's own k/v scales"),
        ("0.34.0", ["--max-num-partial-prefills", "4"], "0.27.0", "remove --max-num-partial-prefills"),
        ("0.34.0", ["--enable-bf16x3-router-gemm"], "0.30.0", "remove --enable-bf16x3-router-gemm"),
        ("0.34.0", ["--override-attention-dtype=float16"], "0.28.0", "remove --override-attention-dtype"),
        ("0.26.0", ["--swap-space", "4"], "0.18.0", "--kv-offloading-size"),
        ("0.13.0", ["--num-redundant-experts", "2"], "0.12.0", "--eplb-config.num_redundant_experts"),
    ],
)
def test_removed_flag_is_refused_naming_release_and_replacement(
    version: str, extra: list[str], removed_in: str, fix: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        plan(version, extra_args=extra)
    assert f"vLLM {removed_in} removed it" in str(caught.value)
    assert f"the image runs {version}" in str(caught.value)
    assert fix in (caught.value.fix or "")


def test_a_flag_the_release_still_has_passes() -> None:
    """0.26 still had --max-num-partial-prefills: passed as given."""
    assert "--max-num-partial-prefills" in plan("0.26.0", extra_args=["--max-num-partial-prefills", "2"]).argv


@pytest.mark.parametrize(
    ("version", "variable", "removed_in"),
    [
        ("0.34.0", "VLLM_USE_V2_MODEL_RUNNER", "0.34.0"),
        ("0.33.0", "VLLM_ENGINE_ITERATION_TIMEOUT_S", "0.32.0"),
        ("0.34.0", "VLLM_ENGINE_ITERATION_TIMEOUT_S", "0.32.0"),
    ],
)
def test_removed_variable_is_refused(version: str, variable: str, removed_in: str) -> None:
    with pytest.raises(ConfigError) as caught:
        plan(version, env={variable: "1"})
    assert f"env {variable}: vLLM {removed_in} removed it" in str(caught.value)
    assert f"remove {variable} from env" in (caught.value.fix or "")


def test_variable_vllm_refuses_carries_its_migration_hint() -> None:
    """0.34's own removed_environment_variables hint is the fix."""
    with pytest.raises(ConfigError) as caught:
        plan("0.34.0", env={"VLLM_MARLIN_INPUT_DTYPE": "int8"})
    assert "--quantization humming" in (caught.value.fix or "")


def test_variables_still_read_and_others_pass() -> None:
    """0.33 still reads VLLM_USE_V2_MODEL_RUNNER; variables that are not vLLM's are never judged."""
    assert plan("0.33.0", env={"VLLM_USE_V2_MODEL_RUNNER": "1"}).env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert plan("0.34.0", env={"HF_HUB_OFFLINE": "1", "NCCL_DEBUG": "INFO"}).env["NCCL_DEBUG"] == "INFO"


def test_every_removal_in_the_catalogue_is_refused_on_each_later_release() -> None:
    """For every release, every flag an earlier release had and it lacks is refused, naming the removal."""
    catalogue = load_catalogue()
    checked = 0
    for version in catalogue.releases[1:]:
        target = caps(version)
        before = [v for v in catalogue.releases if version_key(v) < version_key(version)]
        older = {f for v in before for names in catalogue.entries[v]["flags"].values() for f in names}
        older = {f for f in older if f.startswith("--") and not f.startswith(("--no-", "--disable-"))}
        gone = sorted(f for f in older if not target.has(f) and catalogue.removed_by(f, version))
        for removed in gone[:3]:
            with pytest.raises(ConfigError, match=f"extra_args {removed}: vLLM .* removed it"):
                plan(version, extra_args=[removed])
            checked += 1
    assert checked > 20


def test_a_variable_deprecated_for_a_config_field_names_that_field() -> None:
    """VLLM_ATTENTION_BACKEND (read until 0.14, deprecated for --attention-config.backend in 0.13's
    vllm/config/attention.py) is refused on 0.34 with its successor."""
    with pytest.raises(ConfigError) as caught:
        plan("0.34.0", env={"VLLM_ATTENTION_BACKEND": "FLASHINFER"})
    assert "env VLLM_ATTENTION_BACKEND: vLLM 0.15.0 removed it" in str(caught.value)
    assert "use --attention-config.backend" in (caught.value.fix or "")
