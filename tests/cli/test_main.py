"""Tests for dankserve.cli.main's output edge: a closed stdout pipe (`dankserve plan | head -1`) ends quietly with
exit 0, through the real CLI in a subprocess writing into a real pipe."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dankserve.exitcodes import ExitCode
from dankserve.testing import HOSTS_DIR
from tests.harness.daemon import REPO, daemon_globals, free_port, process_deployment, write_config

PIPE_BYTES = 4096
"""The pipe's capacity (Linux's smallest): output larger than this blocks until its reader reads or goes away."""

HOST = HOSTS_DIR / "plan-h100-80gb-x4-2numa-128gb.json"


def through_pipe(argv: list[str], lines: int, *, buffered: bool) -> tuple[int, str]:
    """`dankserve ARGV | head -LINES` (0: the reader is gone before anything is written): exit code and stderr.
    Unbuffered, each write meets the closed pipe inside the command; buffered, a short output meets it only at
    main's flush."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    if lines == 0:
        os.close(read_end)
    command = [sys.executable, "-m", "dankserve", *argv]
    proc = subprocess.Popen(command, stdout=write_end, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    os.close(write_end)
    if lines:
        seen = 0
        while seen < lines and (byte := os.read(read_end, 1)):  # unbuffered: the rest stays in the pipe
            seen += byte == b"\n"
        os.close(read_end)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


@pytest.mark.parametrize(
    ("args", "lines"),
    [(["plan"], 1), (["plan", "--json"], 1), (["plan"], 0), (["probe"], 0), (["plan", "--json"], 0)],
    ids=["plan-head-1", "json-head-1", "plan-closed", "probe-closed", "json-closed"],
)
def test_a_closed_stdout_pipe_ends_quietly_with_exit_0(tmp_path: Path, args: list[str], lines: int) -> None:
    """The reader gone after the first line or before any: exit 0 and nothing on stderr (no traceback, no
    "Exception ignored"), for rich's output (plan, probe) and JSON, buffered or not."""
    deployments = {f"d{i}": process_deployment(free_port(), gpus=[i]) for i in range(4)}
    config = write_config(tmp_path / "dankserve.toml", daemon_globals(tmp_path), deployments)
    argv = ["--config", str(config), *args, "--hardware", str(HOST)]
    whole = subprocess.run([sys.executable, "-m", "dankserve", *argv], capture_output=True, cwd=REPO, check=False)
    assert whole.returncode == ExitCode.OK, whole.stderr
    assert lines == 0 or len(whole.stdout) > 2 * PIPE_BYTES  # more than the pipe holds: the writer meets the close
    for buffered in (False, True):
        assert through_pipe(argv, lines, buffered=buffered) == (ExitCode.OK, ""), buffered


def test_a_closed_pipe_met_by_the_last_buffered_output_keeps_the_commands_exit_code(tmp_path: Path) -> None:
    """Output small enough to wait in the buffer meets the closed pipe only at main's flush: a plan that fits
    still exits 0 quietly, one that does not keeps its exit 4 and its error on stderr."""
    fits = {"chat": process_deployment(free_port(), gpus=[0])}
    config = write_config(tmp_path / "fits.toml", daemon_globals(tmp_path), fits)
    argv = ["--config", str(config), "plan", "--json", "--hardware", str(HOST)]
    assert through_pipe(argv, 0, buffered=True) == (ExitCode.OK, "")
    huge = {"huge": process_deployment(free_port(), gpus=[0], model_facts={"parameter_bytes": 10**13})}
    config = write_config(tmp_path / "huge.toml", daemon_globals(tmp_path), huge)
    code, err = through_pipe(["--config", str(config), "plan", "--json", "--hardware", str(HOST)], 0, buffered=True)
    assert code == ExitCode.INFEASIBLE and err.startswith("error: huge: ") and "Traceback" not in err, err
