"""Malformed configurations (tests/harness/broken_config.py generates them) against `dankserve plan` and
`dankserve run`, in process: exit 2 with a message, never a traceback. tests/reliability/test_malformed_config.py
runs many more examples, and some as real processes."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dankserve.cli.main import main
from dankserve.exitcodes import ExitCode
from dankserve.testing import HOSTS_DIR
from dankserve.testing.hub import StandInHub
from tests.harness.broken_config import HOSTILE, BrokenConfig, Config, base_configs, broken_configs, render, set_field

HOST = HOSTS_DIR / "h200x2-vm-real.json"


def safe_globals(root: Path) -> dict[str, str]:
    """Globals that keep a run away from this machine's state and Podman (which a valid config would reach)."""
    return {
        "state_dir": str(root / "state"),
        "cache_dir": str(root / "cache"),
        "hf_cache_dir": str(root / "hf"),
        "podman_url": f"unix://{root}/no-podman.sock",
    }


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dankserve-malformed-") as made:
        yield Path(made)


@pytest.fixture(autouse=True)
def _quiet(monkeypatch: pytest.MonkeyPatch, hub: StandInHub) -> None:
    """No /etc config, no DANKSERVE_* from outside; `run` leaves the process's logging alone; the
    models (org/model-N) come from the stand-in Hub."""
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setattr("dankserve.settings.files.DEFAULT_CONFIG_PATH", Path("/nonexistent/dankserve.toml"))
    for name in ("DANKSERVE_CONFIG", "DANKSERVE_HARDWARE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("dankserve.logging_setup.configure_logging", lambda *a, **k: "console")


def invoke(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run the CLI in process; its exit code and everything it printed."""
    with pytest.raises(SystemExit) as done:
        main(args)
    out, err = capsys.readouterr()
    code = done.value.code
    return (code if isinstance(code, int) else 1), out + err


def answers_exit_2(config: Path, command: str, capsys: pytest.CaptureFixture[str]) -> str | None:
    """None when `dankserve COMMAND` on this config exits 2 with an error message; else what it did."""
    code, printed = invoke(["--config", str(config), command, "--hardware", str(HOST)], capsys)
    if code != ExitCode.INVALID_INPUT or "error: " not in printed or "Traceback" in printed:
        return f"{command}: exit {code}: {printed[-600:]}"
    return None


def check_example(example: BrokenConfig, root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = root / "dankserve.toml"
    config.write_bytes(example.text)
    for command in ("plan", "run"):
        problem = answers_exit_2(config, command, capsys)
        assert problem is None, (
            f"{example.category} ({example.detail}):\n{example.text.decode(errors='replace')}\n{problem}"
        )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_valid_bases_plan(root: Path, capsys: pytest.CaptureFixture[str], data: st.DataObject) -> None:
    """The generator's valid bases plan (exit 0): what breaks an example is its mutation, not the base."""
    base: Config = data.draw(base_configs())
    config = root / "base.toml"
    config.write_text(render(Config({**safe_globals(root), **base.globals_}, base.deployments)))
    code, printed = invoke(["--config", str(config), "plan", "--hardware", str(HOST)], capsys)
    assert code == ExitCode.OK, printed


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_malformed_configs_exit_2_with_a_message(
    root: Path, capsys: pytest.CaptureFixture[str], data: st.DataObject
) -> None:
    """Every broken configuration makes `plan` and `run` exit 2 with `error: ...`, never a traceback."""
    check_example(data.draw(broken_configs(safe_globals(root))), root, capsys)


HOSTILE_VALUES = [(scope, key, raw) for scope, key, values in HOSTILE for raw in values]


@pytest.mark.parametrize(
    ("scope", "key", "raw"), HOSTILE_VALUES, ids=[f"{s}.{k}={r[:30]}" for s, k, r in HOSTILE_VALUES]
)
def test_every_hostile_value_exits_2(
    root: Path, capsys: pytest.CaptureFixture[str], scope: str, key: str, raw: str
) -> None:
    """Each flag or variable dankserve owns, secret in the open, '-' model, `_option` and nesting bomb: exit 2."""
    base = Config(safe_globals(root), {"chat": {"model": "org/m", "port": 8000, "gpus": [0]}})
    example = BrokenConfig("hostile", f"{scope}.{key}", render(set_field(base, scope, key, raw)).encode())
    check_example(example, root, capsys)
