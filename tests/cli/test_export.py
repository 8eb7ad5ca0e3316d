"""Tests for `dankserve export quadlet`: the unit on stdout or in a file (atomic, 0644, --force), the plan's argv
in Exec=, and the refusals with their exit codes."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from dankserve.exitcodes import ExitCode
from dankserve.runtime.podman.quadlet import emitted_keys, unknown_keys
from tests.harness.cli import RECORDED_HOST, run_in_process
from tests.harness.quadlet import read_entries

FACTS = (
    "model_facts = { num_hidden_layers = 28, head_dim = 64, num_attention_heads = 16, num_key_value_heads = 8,"
    " max_position_embeddings = 40960, parameter_bytes = 1500000000 }"
)


@pytest.fixture(autouse=True)
def _no_default_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No config file but the test's, whatever this machine has in /etc; no recorded host from the environment."""
    monkeypatch.setattr("dankserve.settings.DEFAULT_CONFIG_PATH", tmp_path / "absent.toml")
    for name in ("DANKSERVE_CONFIG", "DANKSERVE_HARDWARE"):
        monkeypatch.delenv(name, raising=False)


def config(tmp_path: Path, extra: str = "") -> str:
    (tmp_path / "key").write_text("sk-NOT-IN-THE-UNIT\n")
    (tmp_path / "key").chmod(0o600)
    (tmp_path / "hf").mkdir(exist_ok=True)
    path = tmp_path / "dankserve.toml"
    path.write_text(
        f'state_dir = "{tmp_path}/state"\ncache_dir = "{tmp_path}/cache"\nhf_cache_dir = "{tmp_path}/hf"\n\n'
        f'[deployments.chat]\nmodel = "Qwen/Qwen3-0.6B"\n{FACTS}\nport = 8001\napi_key_file = "{tmp_path}/key"\n'
        f"{extra}"
    )
    return str(path)


run = run_in_process


def exported(cfg: str, *more: str) -> list[str]:
    return ["--config", cfg, "export", "quadlet", "chat", "--hardware", str(RECORDED_HOST), "--devices", "cdi", *more]


def test_prints_the_unit_with_the_plans_argv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The unit goes to stdout (exit 0): Quadlet's keys only, Exec= the planned argv, the key as a secret only."""
    cfg = config(tmp_path, 'extra_args = ["--served-model-name", "it\'s 100% $HOME"]\n')
    code, out, _ = run(exported(cfg), capsys)
    assert code == ExitCode.OK
    assert unknown_keys(emitted_keys(out)) == []
    code, plan_out, _ = run(["--config", cfg, "plan", "chat", "--json", "--hardware", str(RECORDED_HOST)], capsys)
    [plan] = json.loads(plan_out)
    entries = {e.key: e.words for e in read_entries(out)}
    assert entries["Exec"][: len(plan["argv"])] == tuple(plan["argv"])
    assert entries["Image"] == (plan["image"],)
    assert entries["AddDevice"][0].startswith("nvidia.com/gpu=GPU-")
    assert "sk-NOT-IN-THE-UNIT" not in out and "Secret=dankserve-chat-api_key,type=mount,target=api_key" in out


def test_output_file_is_written_0644_and_kept_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """-o FILE writes the unit with mode 0644; an existing FILE is kept (exit 2 naming it) unless --force."""
    cfg, target = config(tmp_path), tmp_path / "dankserve-chat.container"
    assert run(exported(cfg, "-o", str(target)), capsys)[0] == ExitCode.OK
    assert stat.S_IMODE(target.stat().st_mode) == 0o644 and "[Container]" in target.read_text()
    target.write_text("mine")
    code, _, err = run(exported(cfg, "-o", str(target)), capsys)
    assert code == ExitCode.INVALID_INPUT and str(target) in err and "--force" in err
    assert target.read_text() == "mine"
    assert run(exported(cfg, "-o", str(target), "--force"), capsys)[0] == ExitCode.OK
    assert "[Container]" in target.read_text()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary file left


@pytest.mark.parametrize(
    ("extra", "name", "expected"),
    [
        ("", "absent", "no deployment named 'absent'"),
        ('runtime = "process"\n', "chat", "a Quadlet unit runs a container"),
        ('extra_args = ["--served-model-name", ";"]\n', "chat", "cannot be written as a Quadlet unit"),
    ],
)
def test_refusals_are_exit_2_naming_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str, name: str, expected: str
) -> None:
    """An unknown deployment, a process deployment or a value no unit can carry: exit 2 with the reason."""
    cfg = config(tmp_path, extra)
    args = ["--config", cfg, "export", "quadlet", name, "--hardware", str(RECORDED_HOST), "--devices", "cdi"]
    code, out, err = run(args, capsys)
    assert code == ExitCode.INVALID_INPUT and expected in err and out == ""


def test_auto_devices_without_a_gpu_here_is_exit_3_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a host whose CDI and /dev do not have the recorded GPU, auto is exit 3 pointing at --devices."""
    if Path("/dev/nvidia0").exists():
        pytest.skip("this host has a GPU node: auto passes it through")
    code, _, err = run(
        ["--config", config(tmp_path), "export", "quadlet", "chat", "--hardware", str(RECORDED_HOST)], capsys
    )
    assert code == ExitCode.ENVIRONMENT and "--devices cdi" in err
