"""Tests for `dankserve pull`: against the stand-in Hub, in process."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from dankserve.cli.main import main
from dankserve.exitcodes import ExitCode
from dankserve.testing import HOSTS_DIR
from dankserve.testing.hub import Misbehaviour, StandInHub
from tests.harness.hub import small_repo, tensors_of
from tests.harness.terminal import run_in_terminal

MIB = 1 << 20


@pytest.fixture(autouse=True)
def _environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hub_environment: dict[str, str]) -> None:
    monkeypatch.setattr("dankserve.settings.files.DEFAULT_CONFIG_PATH", tmp_path / "absent.toml")
    monkeypatch.delenv("DANKSERVE_CONFIG", raising=False)


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        main(args)
    out, err = capsys.readouterr()
    return int(done.value.code or 0), out, err


def test_pull_shows_progress_then_the_summary(hub: StandInHub, capsys: pytest.CaptureFixture[str]) -> None:
    """Progress lines with bytes and percent on stderr, then what was fetched; a second pull fetches nothing."""
    small_repo(hub, "cli/pull", 16 * MIB)
    code, out, err = run(["pull", "--model", "cli/pull"], capsys)
    assert code == ExitCode.OK
    assert "of 16 MiB" in err and "%" in err
    assert "cli/pull: 4 of 4 files" in out
    code, out, _ = run(["pull", "--model", "cli/pull"], capsys)
    assert code == ExitCode.OK and "complete already" in out


def test_pull_then_plan_reads_the_cache(hub: StandInHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """After a pull the plan's facts come from the HF cache snapshot."""
    small_repo(hub, "cli/cached", 2 * MIB)
    assert run(["pull", "--model", "cli/cached", "-q"], capsys)[0] == ExitCode.OK
    host = str(HOSTS_DIR / "plan-h100-80gb-x1-64gb.json")
    before = len(hub.requests)
    code, _, _ = run(["plan", "--json", "--model", "cli/cached", "--hardware", host], capsys)
    assert code == ExitCode.OK and len(hub.requests) == before  # no Hub request: the cache answered


def test_pull_refuses_too_little_disk_with_exit_3(hub: StandInHub, capsys: pytest.CaptureFixture[str]) -> None:
    """The free-disk check: exit 3 naming the shortfall and the fix."""
    hub.add_model("cli/huge", {"model_type": "llama"}, tensors_of(4 << 40, 2))
    code, _, err = run(["pull", "--model", "cli/huge"], capsys)
    assert code == ExitCode.ENVIRONMENT and "short" in err and "hf_cache_dir" in err


def test_pull_of_a_local_path_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing to download for a path: exit 2 saying so."""
    code, _, err = run(["pull", "--model", "/models/mine"], capsys)
    assert code == ExitCode.INVALID_INPUT and "nothing to pull" in err


def test_pull_without_a_config_names_the_absent_file_and_its_own_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No config file and no --model: exit 2 naming the absent default file, the fix naming `dankserve pull NAME`."""
    code, _, err = run(["pull"], capsys)
    assert code == ExitCode.INVALID_INPUT and f"there is no config file at {tmp_path / 'absent.toml'}" in err
    assert "dankserve pull NAME" in err and "dankserve plan NAME" not in err


def test_pull_of_an_unknown_deployment_gives_pulls_own_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 39 (low): `pull NOSUCH` said "pass --model to plan an ad-hoc one" (plan's fix): exit 2, and the fix
    names `dankserve pull --model ORG/NAME`; `plan NOSUCH` keeps its own."""
    config = tmp_path / "dankserve.toml"
    config.write_text(f'state_dir = "{tmp_path}/s"\n[deployments.chat]\nmodel = "org/m"\n')
    config.chmod(0o600)
    code, _, err = run(["--config", str(config), "pull", "nosuch"], capsys)
    assert code == ExitCode.INVALID_INPUT and "no deployment named 'nosuch' (deployments: chat)" in err
    assert "`dankserve pull --model ORG/NAME` to download a model by its Hub id" in err and "plan" not in err
    code, _, err = run(["--config", str(config), "plan", "nosuch"], capsys)
    assert code == ExitCode.INVALID_INPUT and "`dankserve plan --model ORG/NAME` to plan an ad-hoc one" in err


def test_pull_is_listed_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    """`dankserve --help` lists pull."""
    code, out, _ = run(["--help"], capsys)
    assert code == ExitCode.OK and "pull" in out


def test_a_failed_pull_on_a_terminal_prints_its_error_on_a_line_of_its_own(
    hub: StandInHub, hub_environment: dict[str, str]
) -> None:
    """On a terminal, a pull that fails after showing progress ends the progress line before the error."""
    small_repo(hub, "cli/corrupt", 2 * MIB)
    hub.repos["cli/corrupt"].misbehaviour = Misbehaviour(corrupt=True)
    dankserve = str(Path(sys.executable).with_name("dankserve"))
    done = run_in_terminal(
        [dankserve, "pull", "--model", "cli/corrupt"], env={**hub_environment, "DANKSERVE_CONFIG": ""}
    )
    assert done.returncode == ExitCode.ENVIRONMENT, done.output
    assert "%" in done.output and re.search(r"\n\s*error: ", done.output), done.output
