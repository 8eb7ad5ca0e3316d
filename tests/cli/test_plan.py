"""Tests for `dankserve plan`: exit codes 0/2/3/4, the JSON shape, list output and the text table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dankserve.exitcodes import ExitCode
from dankserve.testing import HOSTS_DIR
from tests.harness.cli import run_in_process
from tests.plan.builders import PLAN_JSON_KEYS

REPO = Path(__file__).resolve().parent.parent.parent
HOSTS = HOSTS_DIR
EXAMPLE = REPO / "config" / "dankserve.toml"
H100 = str(HOSTS / "plan-h100-80gb-x1-64gb.json")


@pytest.fixture(autouse=True)
def _no_default_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hub_environment: dict[str, str]) -> None:
    """No config file unless a test names one, whatever this machine has in /etc; the models come
    from the stand-in Hub."""
    monkeypatch.setattr("dankserve.settings.files.DEFAULT_CONFIG_PATH", tmp_path / "absent.toml")
    for name in ("DANKSERVE_CONFIG", "DANKSERVE_HARDWARE"):
        monkeypatch.delenv(name, raising=False)


run = run_in_process


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "dankserve.toml"
    path.write_text(text)
    return str(path)


def test_model_without_config_prints_the_json_plan(capsys: pytest.CaptureFixture[str]) -> None:
    """`plan --json --hardware H --model M` exits 0 with a one-entry list of exactly the documented keys."""
    code, out, _ = run(["plan", "--json", "--hardware", H100, "--model", "Qwen/Qwen3-30B-A3B"], capsys)
    assert code == ExitCode.OK
    [data] = json.loads(out)
    assert list(data) == PLAN_JSON_KEYS
    assert data["deployment"] == "--model Qwen/Qwen3-30B-A3B"
    assert data["image"] == "docker.io/vllm/vllm-openai:v0.34.0"
    assert data["argv"][0] == "Qwen/Qwen3-30B-A3B"
    assert all(isinstance(t, str) for t in data["argv"])
    assert all(list(f) == ["flag", "value", "reason"] for f in data["flags"])
    assert data["env"]["NO_COLOR"] == "1"
    assert not any("model facts unknown" in w for w in data["warnings"])  # read from the (stand-in) Hub
    assert data["capacity"]["context_tokens"] == 40960


def test_hardware_from_the_environment(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """$DANKSERVE_HARDWARE names the recorded host when --hardware is absent."""
    monkeypatch.setenv("DANKSERVE_HARDWARE", H100)
    code, out, _ = run(["plan", "--json", "--model", "m/m"], capsys)
    assert code == ExitCode.OK and json.loads(out)[0]["argv"][0] == "m/m"


def test_vllm_version_option_changes_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """--vllm-version 0.11.0 plans --swap-space instead of --kv-offloading-size."""
    code, out, _ = run(["plan", "--json", "--hardware", H100, "--model", "m/m", "--vllm-version", "0.11.0"], capsys)
    assert code == ExitCode.OK
    assert "--swap-space" in json.loads(out)[0]["argv"]


def test_several_enabled_deployments_print_a_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without DEPLOYMENT every enabled deployment is planned and --json prints a list."""
    config = write_config(
        tmp_path,
        '[deployments.a]\nmodel = "o/a"\ngpu_memory_utilization = 0.45\n'
        '[deployments.b]\nmodel = "o/b"\nport = 8001\ngpu_memory_utilization = 0.45\n'
        '[deployments.c]\nmodel = "o/c"\nport = 8002\nenabled = false\n',
    )
    code, out, _ = run(["--config", config, "plan", "--json", "--hardware", H100], capsys)
    assert code == ExitCode.OK
    assert [p["deployment"] for p in json.loads(out)] == ["a", "b"]


def test_example_config_plans_its_enabled_deployment(capsys: pytest.CaptureFixture[str]) -> None:
    """The shipped example plans (its one enabled deployment) on an A100 80 GB host."""
    host = str(HOSTS / "plan-a100-80gb-x1-64gb.json")
    code, out, _ = run(["--config", str(EXAMPLE), "plan", "--json", "--hardware", host], capsys)
    assert code == ExitCode.OK
    assert [p["deployment"] for p in json.loads(out)] == ["qwen3-30b"]


def test_text_output_has_command_and_each_flag_with_its_reason(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The text form prints the full `vllm serve` command, then each flag with its value and its reason beneath."""
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run(["plan", "--hardware", H100, "--model", "Qwen/Qwen3-30B-A3B"], capsys)
    assert code == ExitCode.OK
    assert "vllm serve Qwen/Qwen3-30B-A3B --tensor-parallel-size 1" in out
    lines = out.splitlines()
    flag = next(i for i, line in enumerate(lines) if line.startswith("--gpu-memory-utilization "))
    assert lines[flag + 1].startswith("      ") and lines[flag + 1].strip()


def test_text_plan_reads_at_80_columns_and_names_what_runs_the_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 80 columns each flag and value share a line and its reason wraps beneath it to the width (a few lines, not
    a 14-character column); a process deployment's header names the process, not a container image; a model whose
    length is unknown says so once."""
    monkeypatch.setenv("COLUMNS", "80")
    model = tmp_path / "weights"
    model.mkdir()
    config = write_config(
        tmp_path,
        f'[deployments.a]\nmodel = "{model}"\nruntime = "process"\nexecutable = "/opt/vllm/bin/vllm"\n'
        "[deployments.a.model_facts]\nparameter_bytes = 2000000000\n",
    )
    code, out, err = run(["--config", config, "plan", "--hardware", H100], capsys)
    assert code == ExitCode.OK, err
    lines = out.splitlines()
    assert "process /opt/vllm/bin/vllm" in lines[0] and "vllm-openai" not in lines[0]
    assert all(len(line) <= 80 for line in lines if " vllm serve " not in line), out
    flags = [i for i, line in enumerate(lines) if line.startswith("--")]
    assert "--gpu-memory-utilization" in out and flags
    for start, end in zip(flags, [*flags[1:], len(lines)], strict=True):
        reason = [line for line in lines[start + 1 : end] if line.startswith("      ")]
        assert 1 <= len(reason) <= 5, lines[start:end]
    assert "(the model's own)" not in out and "the model's own length, not known here" in out


def test_a_local_model_path_that_does_not_exist_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`plan --model /no/such/dir` (or ./relative) is exit 2 naming the path; a Hub id is not mistaken for one."""
    missing = tmp_path / "no" / "such-model"
    code, out, err = run(["plan", "--hardware", H100, "--model", str(missing)], capsys)
    assert code == ExitCode.INVALID_INPUT and out == ""
    assert str(missing) in err and "does not exist" in err and "ORG/NAME" in err
    assert f"error: --model {str(missing)!r}: the local path" in err and "deployments." not in err
    code, _, err = run(["plan", "--hardware", H100, "--model", "./no-such-model/v1"], capsys)
    assert code == ExitCode.INVALID_INPUT and "./no-such-model/v1" in err
    code, _, err = run(["plan", "--hardware", H100, "--model", "Qwen/Qwen3-30B-A3B"], capsys)
    assert code == ExitCode.OK, err


@pytest.mark.parametrize(
    ("config", "args", "expected"),
    [
        ('[deployments.a]\nmodel = "o/a"\nkv_cache_dtype = "q8_0"\n', [], "q8_0"),
        ('[deployments.a]\nmodel = "o/a"\ngpus = [3]\n', [], "GPU 3"),
        ('[deployments.a]\nmodel = "o/a"\n', ["nope"], "no deployment named 'nope'"),
        ('[deployments.a]\nmodel = "o/a"\nflavour = 1\n', [], "unknown key"),
        ('[deployments.a]\nmodel = "o/a"\nmax_num_seq = 64\n', [], "did you mean 'max_num_seqs'?"),
        ('[deployments.a]\nmodel = "o/a"\nattention_backend = "WARP_DRIVE"\n', [], "WARP_DRIVE"),
    ],
)
def test_invalid_input_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: str, args: list[str], expected: str
) -> None:
    """Unknown KV dtypes, missing GPUs, unknown deployments, unknown keys and backends exit 2 with a message."""
    path = write_config(tmp_path, config)
    code, out, err = run(["--config", path, "plan", *args, "--hardware", H100], capsys)
    assert code == ExitCode.INVALID_INPUT
    assert expected in err and "Traceback" not in err
    assert out == ""


def test_no_deployment_and_no_model_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With no config and no --model there is nothing to plan: exit 2, naming the default file that is absent."""
    code, _, err = run(["plan", "--hardware", H100], capsys)
    assert code == ExitCode.INVALID_INPUT and "no deployments are configured" in err
    assert f"(there is no config file at {tmp_path / 'absent.toml'})" in err


def test_malformed_hardware_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A recorded-host file that is not the schema exits 2 naming the file."""
    bad = tmp_path / "host.json"
    bad.write_text('{"schema_version": 1, "gpus": []}')
    code, _, err = run(["plan", "--hardware", str(bad), "--model", "m/m"], capsys)
    assert code == ExitCode.INVALID_INPUT and str(bad) in err


@pytest.mark.parametrize(
    "config",
    [
        '[deployments.a]\nmodel = "o/a"\n[deployments.a.model_facts]\nparameter_bytes = 500_000_000_000\n',
        '[deployments.a]\nmodel = "o/a"\ntensor_parallel_size = 2\n',
        '[deployments.a]\nmodel = "o/a"\n[deployments.b]\nmodel = "o/b"\nport = 8001\n',  # 0.90 + 0.90 on GPU 0
        '[deployments.a]\nmodel = "o/a"\nimage = "vllm/vllm-openai:v0.19.0"\nnuma_bind = true\n',
    ],
    ids=["weights", "tp-over-gpus", "shared-gpu", "flag-missing"],
)
def test_infeasible_plans_exit_4(tmp_path: Path, capsys: pytest.CaptureFixture[str], config: str) -> None:
    """Weights that do not fit, TP over the GPUs, an over-shared GPU and a flag the release lacks exit 4."""
    code, out, err = run(["--config", write_config(tmp_path, config), "plan", "--hardware", H100], capsys)
    assert code == ExitCode.INFEASIBLE
    assert err.startswith("error: ") and "fix:" in err and out == ""


def test_without_gpus_and_without_a_recorded_host_it_is_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --hardware on a machine where NVML finds no GPU, plan exits 3 naming the way out."""
    from tests.harness.gpus import nvml_unusable_reason

    if nvml_unusable_reason() is None:
        pytest.skip("NVML works here: the probe succeeds")
    monkeypatch.delenv("DANKSERVE_HARDWARE", raising=False)
    code, _, err = run(["plan", "--model", "m/m"], capsys)
    assert code == ExitCode.ENVIRONMENT and "error:" in err


RTX4090 = str(HOSTS / "rtx4090x1-1numa.json")


def test_uncached_model_is_planned_exactly_from_the_hub(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's first run: Qwen3-8B at 8192 on one 4090, not in any cache: facts from the Hub, the band's
    0.75, its parsers, and the promise in the user's terms."""
    config = write_config(tmp_path, '[deployments.chat]\nmodel = "Qwen/Qwen3-8B"\nmax_model_len = 8192\n')
    code, out, _ = run(["plan", "--config", config, "--json", "--hardware", RTX4090], capsys)
    assert code == ExitCode.OK
    [data] = json.loads(out)
    argv = data["argv"]
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.75"
    assert "--reasoning-parser" in argv
    assert data["capacity"]["context_tokens"] == 8192 and data["capacity"]["concurrency"] >= 1
    assert not any("model facts unknown" in w for w in data["warnings"])


@pytest.mark.parametrize(
    ("model", "code", "says"),
    [("org/gated", ExitCode.INVALID_INPUT, "gated"), ("org/absent", ExitCode.INVALID_INPUT, "no model 'org/absent'")],
)
def test_hub_refusals_exit_2_before_anything_starts(
    capsys: pytest.CaptureFixture[str], model: str, code: int, says: str
) -> None:
    """Gated and unknown models: exit 2 naming the model and the fix, no traceback."""
    got, _, err = run(["plan", "--hardware", H100, "--model", model], capsys)
    assert got == code and says in err and "fix:" in err and "Traceback" not in err


def test_offline_and_uncached_exits_3(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """HF_HUB_OFFLINE with the model nowhere on this host: exit 3 naming it."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run(["plan", "--hardware", H100, "--model", "o/a"], capsys)
    assert code == ExitCode.ENVIRONMENT and "o/a" in err and "HF_HUB_OFFLINE" in err


def test_infeasible_plan_still_prints_its_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json with a plan that cannot fit: the list still comes, the entry carries the error; exit 4."""
    config = write_config(
        tmp_path,
        '[deployments.ok]\nmodel = "o/a"\ngpu_memory_utilization = 0.3\n'
        '[deployments.big]\nmodel = "Qwen/Qwen3-8B"\nport = 8001\nmax_model_len = 40960\n'
        "gpu_memory_utilization = 0.3\n",
    )
    code, out, err = run(["--config", config, "plan", "--json", "--hardware", RTX4090], capsys)
    assert code == ExitCode.INFEASIBLE
    ok, big = json.loads(out)
    assert ok["deployment"] == "ok" and "argv" in ok
    assert big["deployment"] == "big" and big["error"]["exit_code"] == 4 and big["error"]["fix"]
    assert "big" in err


def test_an_ad_hoc_plan_names_its_model_in_fit_errors_not_a_default_deployment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`plan --model M` that does not fit, alone or beside a configured deployment: the errors (text and --json)
    name "--model M", never a deployment "default" the user did not write."""
    config = write_config(tmp_path, '[deployments.a]\nmodel = "o/a"\n')
    code, _, err = run(["--config", config, "plan", "--hardware", H100, "--model", "o/b"], capsys)
    assert code == ExitCode.INFEASIBLE and "GPU 0 is shared by --model o/b, a " in err, err
    assert "(--model o/b 0.90 + a 0.90)" in err and "default" not in err

    code, out, err = run(["plan", "--json", "--hardware", RTX4090, "--model", "Qwen/Qwen3-30B-A3B"], capsys)
    assert code == ExitCode.INFEASIBLE
    [entry] = json.loads(out)
    assert entry["deployment"] == "--model Qwen/Qwen3-30B-A3B" and "does not fit" in entry["error"]["message"]
    assert err.startswith("error: --model Qwen/Qwen3-30B-A3B: Qwen/Qwen3-30B-A3B does not fit") and "default" not in err


def test_named_plan_is_checked_against_the_others(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`plan a` sees that b shares its GPU beyond 0.95 (only `plan` without a name did before)."""
    config = write_config(
        tmp_path,
        '[deployments.a]\nmodel = "o/a"\ngpu_memory_utilization = 0.6\n'
        '[deployments.b]\nmodel = "o/b"\nport = 8001\ngpu_memory_utilization = 0.6\n',
    )
    code, _, err = run(["--config", config, "plan", "a", "--hardware", H100], capsys)
    assert code == ExitCode.INFEASIBLE and "shared by a, b" in err


def test_global_options_after_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`dankserve plan --config F` works as `dankserve --config F plan` does."""
    config = write_config(tmp_path, '[deployments.only]\nmodel = "o/a"\n')
    code, out, _ = run(["plan", "--json", "--hardware", H100, "--config", config, "--debug"], capsys)
    assert code == ExitCode.OK and [p["deployment"] for p in json.loads(out)] == ["only"]


def test_five_small_deployments_on_auto_kv_offload_share_the_hosts_ram(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five deployments on the default kv_offload = "auto" on a 252 GiB host: each gets its share of the RAM the host
    gives to offload (not 64 GiB each, 320 GiB in all, refused), and the reason says so."""
    from dankserve.testing.config_file import write_config as write_toml
    from tests.harness.daemon import MODEL_FACTS

    monkeypatch.setenv("COLUMNS", "200")
    deployments = {
        f"d{i}": {"model": "test/tiny", "port": 18100 + i, "gpus": [i % 2], "gpu_memory_utilization": 0.3}
        | {"model_facts": MODEL_FACTS}
        for i in range(5)
    }
    config = write_toml(tmp_path / "five.toml", {"vllm_version": "0.33.0"}, deployments)
    code, out, err = run(
        ["--config", str(config), "plan", "--json", "--hardware", str(HOSTS / "h200x2-vm-real.json")], capsys
    )
    assert code == ExitCode.OK, err
    plans = json.loads(out)
    sizes = [next(f for f in p["flags"] if f["flag"] == "--kv-offloading-size") for p in plans]
    assert [s["value"] for s in sizes] == ["44"] * 5
    assert all("5 deployment(s) on auto share the 220.3 GiB" in s["reason"] for s in sizes)


@pytest.mark.parametrize("host", ["rtx3090x1-4core", "rtx3090x2-1numa", "a100-40x8-2numa", "a100-80x4-1numa"])
def test_a_gpu_without_fp8_still_gets_a_kv_figure_when_model_facts_name_no_dtype(
    host: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 39 (low): on RTX 3090 and A100 (no fp8 KV cache: --kv-cache-dtype auto) a deployment whose
    model_facts name no dtype_bytes got no KV figure and no reason; vLLM computes in bf16/fp16 then, so the KV
    cache's element is 2 bytes and the plan promises its tokens and concurrency."""
    cfg = write_config(
        tmp_path,
        '[deployments.chat]\nmodel = "org/m"\n[deployments.chat.model_facts]\nparameter_bytes = 2000000000\n'
        "num_attention_heads = 32\nnum_key_value_heads = 8\nnum_hidden_layers = 16\nhead_dim = 64\n"
        "max_position_embeddings = 8192\n",
    )
    code, out, err = run(["--config", cfg, "plan", "--json", "--hardware", str(HOSTS / f"{host}.json")], capsys)
    assert code == ExitCode.OK, err
    [plan] = json.loads(out)
    assert plan["argv"][plan["argv"].index("--kv-cache-dtype") + 1] == "auto"
    capacity = plan["capacity"]
    per_token = 2 * 16 * 8 * 64 * 2  # K and V, layers, KV heads, head_dim, 2 bytes
    assert capacity["kv_cache_tokens"] is not None and capacity["kv_cache_tokens"] > 0, plan
    assert capacity["concurrency"] == pytest.approx(capacity["kv_cache_tokens"] / 8192, rel=0.01)
    code, text, _ = run(["--config", cfg, "plan", "--hardware", str(HOSTS / f"{host}.json")], capsys)
    assert "the KV cache holds about" in " ".join(text.split())
    assert per_token == 32768


def test_the_example_config_leaves_no_gpu_idle_on_a_two_gpu_host(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 39 (low): the shipped example planned with GPU 1 of a 2 x H200 host assigned but idle (a warning);
    it names GPU 0, which holds the model, and plans without warnings."""
    host = str(HOSTS / "h200x2-vm-real.json")
    code, out, err = run(["--config", str(EXAMPLE), "plan", "--json", "--hardware", host], capsys)
    assert code == ExitCode.OK, err
    [plan] = json.loads(out)
    assert plan["gpus"] == [0] and not [w for w in plan["warnings"] if "idle" in w], plan["warnings"]
