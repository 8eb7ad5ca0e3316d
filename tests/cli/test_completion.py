"""Shell completion through click's `_DANKSERVE_COMPLETE` protocol (README documents the set-up)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts_are_printed(shell: str) -> None:
    """`_DANKSERVE_COMPLETE=SHELL_source dankserve` prints the shell's completion script."""
    env = {**os.environ, "_DANKSERVE_COMPLETE": f"{shell}_source"}
    done = subprocess.run([sys.executable, "-m", "dankserve"], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "_DANKSERVE_COMPLETE" in done.stdout


def test_commands_complete() -> None:
    """`dankserve pl<TAB>` offers plan; `dankserve plan --con<TAB>` offers the global --config too."""
    env = {**os.environ, "_DANKSERVE_COMPLETE": "bash_complete", "COMP_WORDS": "dankserve pl", "COMP_CWORD": "1"}
    done = subprocess.run([sys.executable, "-m", "dankserve"], env=env, capture_output=True, text=True, check=False)
    assert "plan" in done.stdout
    env.update(COMP_WORDS="dankserve plan --con", COMP_CWORD="2")
    done = subprocess.run([sys.executable, "-m", "dankserve"], env=env, capture_output=True, text=True, check=False)
    assert "--config" in done.stdout


def complete(words: str, env_extra: dict[str, str] | None = None) -> list[str]:
    """What bash completion offers for the last of `words` (a trailing space: a new, empty word)."""
    parts = words.split(" ")
    env = {
        **os.environ,
        **(env_extra or {}),
        "_DANKSERVE_COMPLETE": "bash_complete",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(parts) - 1),
    }
    done = subprocess.run([sys.executable, "-m", "dankserve"], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return [line.split(",", 1)[1] for line in done.stdout.splitlines() if line.startswith("plain,")]


@pytest.mark.parametrize(
    "command", ["up", "down", "logs", "sleep", "wake", "plan", "pull", "restart", "upgrade", "rollback"]
)
def test_deployment_names_complete_from_the_config_even_when_it_does_not_validate(tmp_path: Path, command: str) -> None:
    """`dankserve COMMAND <TAB>` offers the config's deployment names (with --config before or after the command,
    or $DANKSERVE_CONFIG), also from a config with an invalid value, and nothing from an unreadable one."""
    config = tmp_path / "dankserve.toml"
    config.write_text(
        '[deployments.alpha]\nmodel = "a/b"\nmax_num_seqs = "lots"\n[deployments.beta]\nmodel = "c/d"\n'
        '[deployments.apple]\nmodel = "e/f"\n'
    )
    config.chmod(0o600)
    assert complete(f"dankserve --config {config} {command} ") == ["alpha", "apple", "beta"]
    assert complete(f"dankserve {command} --config {config} ") == ["alpha", "apple", "beta"]
    assert complete(f"dankserve --config {config} {command} a") == ["alpha", "apple"]
    assert complete(f"dankserve {command} b", {"DANKSERVE_CONFIG": str(config)}) == ["beta"]
    config.write_text("[deployments.alpha\n")
    assert complete(f"dankserve --config {config} {command} ") == []
