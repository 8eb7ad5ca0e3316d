"""README.md against the CLI (issue 39, low): its command table names every command `dankserve --help` lists
(upgrade and rollback were missing), and its offline `plan` example plans without the network."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from dankserve.cli.main import COMMANDS

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def test_the_command_table_names_every_command() -> None:
    table = README[README.index("## Commands") : README.index("## Exit codes")]
    named = set(re.findall(r"^\| `dankserve ([a-z-]+)", table, re.M)) | set(
        re.findall(r", `dankserve ([a-z-]+)", table)
    )
    assert set(COMMANDS) - named == set(), f"README's command table lacks {sorted(set(COMMANDS) - named)}"


def test_the_offline_plan_example_plans_with_no_network_and_plan_model_says_so() -> None:
    """The README's `# offline` line runs with HF_HUB_OFFLINE=1 (exit 0); it says that `plan --model` needs the
    HF cache or the Hub."""
    line = next(line for line in README.splitlines() if line.rstrip().endswith("# offline"))
    argv = line.split("#")[0].split()
    assert argv[0] == "dankserve"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DANKSERVE_")}
    env |= {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}  # no Hub reachable
    done = subprocess.run(
        [sys.executable, "-m", "dankserve", *argv[1:]],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "promises: context" in done.stdout
    assert "the first time it needs the network" in README
