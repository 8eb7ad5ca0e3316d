"""Shell completion through click's `_DANKSERVE_COMPLETE` protocol (README documents the set-up)."""

from __future__ import annotations

import os
import subprocess
import sys

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
