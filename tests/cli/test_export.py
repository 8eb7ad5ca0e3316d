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


def _podman_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str | None) -> None:
    """PATH with only a `podman` that says `version` (None: no podman at all)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if version is not None:
        fake = bin_dir / "podman"
        fake.write_text(f"#!/bin/sh\necho 'podman version {version}'\n")
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))


@pytest.mark.parametrize(
    ("version", "said"),
    [
        ("4.3.1", "this host's Podman 4.3.1 has no Quadlet (it came with Podman 4.4; Debian 12 ships 4.3)"),
        ("4.9.3", "this host's Podman 4.9.3 has Quadlet but not the unit's Entrypoint= and Notify=healthy"),
        (None, "Podman is not installed here: the unit runs where Podman 5.0 or later is"),
        ("5.4.2", None),
    ],
)
def test_says_when_this_hosts_podman_cannot_use_the_unit(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    version: str | None,
    said: str | None,
) -> None:
    """Issue 39.10: the unit is printed either way (it may be for another host, exit 0), with a warning on stderr
    when this host's Podman cannot use it (Quadlet came with 4.4; the unit needs 5.0)."""
    cfg = config(tmp_path)
    _podman_on_path(tmp_path, monkeypatch, version)
    code, out, err = run(exported(cfg), capsys)
    assert code == ExitCode.OK and "[Container]" in out
    if said is None:
        assert "warning" not in err
    else:
        assert f"warning: {said}" in err


@pytest.mark.parametrize(
    ("image", "auto_update"),
    [
        ("docker.io/vllm/vllm-openai:v0.33.0", "registry"),
        ("registry.example:5000/team/vllm:v1", "registry"),
        ("localhost/fake-vllm:latest", None),
        ("docker.io/vllm/vllm-openai@sha256:" + "0" * 64, None),
    ],
)
def test_the_unit_is_started_once_serving_and_auto_updates_a_registry_tag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], image: str, auto_update: str | None
) -> None:
    """Issue 39.10: HealthCmd= asks vLLM's /health on the server's port and Notify=healthy makes `systemctl start`
    return once it serves (the start period is boot_timeout_seconds); an image named by a registry and a tag gets
    AutoUpdate=registry, a local image or a digest none."""
    cfg = config(tmp_path, f'image = "{image}"\n')
    Path(cfg).write_text(Path(cfg).read_text().replace("state_dir =", "boot_timeout_seconds = 1200\nstate_dir =", 1))
    code, out, err = run(exported(cfg), capsys)
    assert code == ExitCode.OK, err
    assert unknown_keys(emitted_keys(out)) == []
    entries = {e.key: e.words for e in read_entries(out)}
    command = json.loads(entries["HealthCmd"][0])
    assert command[:2] == ["python3", "-c"] and "/health" in command[2]
    assert ":8001/health" in command[2] or ":8000/health" in command[2]
    assert entries["Notify"] == ("healthy",) and entries["HealthStartPeriod"] == ("1200s",)
    assert entries["HealthOnFailure"] == ("kill",)
    assert entries.get("AutoUpdate") == ((auto_update,) if auto_update else None)
    assert "\nTimeoutStartSec=2100\n" in out  # 900 s for the pull, then the boot's 1200: systemd waits for health
