"""Config errors as the real CLI prints them (a subprocess): key path, value, the expectation in plain words, a fix;
never pydantic's internals; a suggestion for a mistyped key or command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dankserve.testing import HOSTS_DIR

REPO = Path(__file__).resolve().parents[1]
HOST = HOSTS_DIR / "h200x2-vm-real.json"


def dankserve(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DANKSERVE_CONFIG", "DANKSERVE_HARDWARE")}
    return subprocess.run(
        [sys.executable, "-m", "dankserve", *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def plan_with(tmp_path: Path, lines: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "dankserve.toml"
    config.write_text(f'[deployments.chat]\nmodel = "o/m"\n{lines}\n')
    config.chmod(0o600)
    return dankserve("--config", str(config), "plan", "--hardware", str(HOST))


@pytest.mark.parametrize(
    ("lines", "said", "fix"),
    [
        (
            "max_num_seq = 64",
            "unknown key 'deployments.chat.max_num_seq' = 64: did you mean 'max_num_seqs'?",
            "fix: rename max_num_seq to max_num_seqs",
        ),
        (
            'max_model_len = "lots"',
            "deployments.chat.max_model_len = 'lots': expected a whole number or 'auto'",
            "fix: set deployments.chat.max_model_len to a whole number or 'auto'",
        ),
        (
            'kv_offload = "maybe"',
            "deployments.chat.kv_offload = 'maybe': expected a number or one of 'auto', 'off'",
            "fix: set deployments.chat.kv_offload",
        ),
        ("gpu_memory_utilization = 2", "gpu_memory_utilization = 2: expected a number of at most 1", "fix: set"),
        (
            'swap_group = "g"\nsleep_level = "deep"',
            "deployments.chat.sleep_level = 'deep': expected one of 'auto', '1', '2', 'stop', 'suspend'",
            "fix: set deployments.chat.sleep_level to one of 'auto', '1', '2', 'stop', 'suspend'",
        ),
    ],
)
def test_a_config_error_names_key_value_expectation_and_fix_in_plain_words(
    tmp_path: Path, lines: str, said: str, fix: str
) -> None:
    """Each refused value: exit 2, one line naming the key path and value and what is expected, a fix; no
    `.int` / `literal[...]` / `Input should` of pydantic's, the `dankserve install` pointer at most once."""
    done = plan_with(tmp_path, lines)
    assert done.returncode == 2 and done.stdout == ""
    assert said in done.stderr and fix in done.stderr, done.stderr
    for internal in (".int", "literal[", "Input should", "Extra inputs", "Traceback"):
        assert internal not in done.stderr, done.stderr
    assert done.stderr.count("dankserve install") <= 1


def test_several_errors_are_one_line_each_and_one_fix(tmp_path: Path) -> None:
    """Two bad keys: a line for each (one for a key pydantic checked against two union members) and one fix."""
    done = plan_with(tmp_path, 'max_model_len = "lots"\nflavour = 1')
    assert done.returncode == 2
    assert done.stderr.count("max_model_len") == 1 and "unknown key 'deployments.chat.flavour' = 1" in done.stderr
    assert done.stderr.count("fix:") == 1 and done.stderr.count("dankserve install") == 1


def test_a_mistyped_command_gets_the_nearest_command(tmp_path: Path) -> None:
    """`dankserve stauts` exits 2 suggesting `status`; a name like no command suggests nothing."""
    done = dankserve("stauts")
    assert done.returncode == 2 and "Did you mean 'status'?" in done.stderr
    done = dankserve("frobnicate")
    assert done.returncode == 2 and "Did you mean" not in done.stderr


def test_other_tools_verbs_get_the_dankserve_command_that_does_it() -> None:
    """`stop`, `start`, `ps`, `ls` (systemctl's, docker's, ollama's words): exit 2 naming the dankserve command, the
    arguments kept; `stop` also names `sleep` for a swap group member."""
    for typed, meant in (("stop", "down"), ("start", "up"), ("ps", "status"), ("ls", "status")):
        done = dankserve(typed, "chat")
        assert done.returncode == 2, done.stderr
        assert f"No such command '{typed}'. Did you mean `dankserve {meant} chat`?" in done.stderr, done.stderr
    assert "dankserve sleep NAME" in dankserve("stop").stderr
