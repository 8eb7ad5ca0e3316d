"""Tests for dankserve.demo: the summary (pure), and `make demo`'s flow end to end on real Podman."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dankserve.demo import (
    CDI_PREFIX,
    DEMO_TOOLS,
    PURPOSE,
    Boot,
    FlowResult,
    Leftovers,
    processes_mentioning,
    ready_times,
    summary_lines,
)
from dankserve.testing.podman_service import missing_requirements, private_env, run_root, storage_root

NOTHING_LEFT = Leftovers((), (), cdi_spec=False, device_nodes=False)
COLD = Boot(1, 6.5, 131_125_220_967, learned_used=False, compile_cache_hit=False)
WARM = Boot(2, 3.1, 131_125_220_967, learned_used=True, compile_cache_hit=True)


def test_summary_gives_cold_and_warm_boot_times_and_what_is_left() -> None:
    """The summary names both boots, the time saved, the learned bytes and that nothing is left."""
    text = "\n".join(summary_lines(FlowResult(["planned"], [COLD, WARM], restarts=1), NOTHING_LEFT, None))
    assert "boot 1 (cold): ready in 6.5 s" in text and "compile cache miss" in text
    assert "boot 2 (warm, after the kill): ready in 3.1 s" in text
    assert "learned, passed as --kv-cache-memory-bytes; compile cache hit" in text
    assert "6.5 s -> 3.1 s (52 % less)" in text
    assert "left running: nothing" in text and "ran to the end" in text


@pytest.mark.parametrize(
    ("leftovers", "shown"),
    [
        (Leftovers(("dankserve-demo",), (), False, False), "containers dankserve-demo"),
        (Leftovers((), ("42 podman system service",), False, False), "processes 42 podman system service"),
        (Leftovers((), (), True, False), "the CDI spec"),
        (Leftovers((), (), False, True), "the stand-in device nodes"),
    ],
)
def test_summary_names_what_was_left_behind(leftovers: Leftovers, shown: str) -> None:
    """Anything left after the clean-up is named in the summary, never reported as nothing."""
    text = "\n".join(summary_lines(FlowResult(), leftovers, None))
    assert f"LEFT BEHIND: {shown}" in text and "left running: nothing" not in text


def test_summary_of_a_failed_run_says_so() -> None:
    """A run that failed ends with FAILED and the reason."""
    text = "\n".join(summary_lines(FlowResult(), NOTHING_LEFT, "`dankserve up` exited with 4"))
    assert "result: FAILED: `dankserve up` exited with 4" in text


def test_ready_times_reads_the_daemons_json_log(tmp_path: Path) -> None:
    """Boot durations come from the daemon's `ready` events of the demo deployment, in order."""
    log = tmp_path / "daemon.log"
    lines = [
        {"event": "ready", "deployment": "demo", "boot_seconds": 6.5},
        {"event": "phase", "deployment": "demo", "phase": "loading"},
        {"event": "ready", "deployment": "other", "boot_seconds": 1.0},
        {"event": "ready", "deployment": "demo", "boot_seconds": 3.1},
    ]
    log.write_text("\n".join(json.dumps(line) for line in lines) + "\nnot json\n")
    assert ready_times(log) == [6.5, 3.1]


def test_demo_without_its_tools_exits_3_with_the_fix() -> None:
    """Without Podman on PATH the demo stops before setting anything up: exit 3 and how to fix it."""
    env = {**os.environ, "PATH": "/nonexistent"}
    done = subprocess.run(
        [sys.executable, "-m", "dankserve.demo"], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert "STAND-IN vLLM" in done.stdout and "missing podman" in done.stdout and "fix: run `make demo`" in done.stdout


@pytest.mark.podman
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_demo_runs_the_whole_flow_and_leaves_nothing_running(tmp_path: Path) -> None:
    """`python -m dankserve.demo` plans, boots cold, recovers a killed container warm, stops, and leaves nothing."""
    missing = missing_requirements(DEMO_TOOLS)
    if missing:
        pytest.skip(f"the demo cannot run here: missing {', '.join(missing)}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dankserve.demo"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = proc.communicate(timeout=780)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the demo cleans up on SIGTERM
        out, err = proc.communicate(timeout=100)
        pytest.fail(f"the demo did not finish in 780 s:\n{out[-4000:]}")
    assert proc.returncode == 0, out[-4000:] + err[-2000:]
    assert "dankserve DEMO" in out and "STAND-IN vLLM" in out
    for command in ("$ dankserve plan demo", "$ dankserve up --timeout", "$ podman kill dankserve-demo"):
        assert command in out
    assert "$ dankserve status\n" in out and "$ dankserve down" in out and "dankserve stopped" in out
    for phase in ("demo: loading", "demo: ready", "demo: ready, serving at http://127.0.0.1:"):
        assert phase in out
    assert re.search(r"boot 1 \(cold\): ready in [0-9.]+ s; .*profiled by vLLM, then learned; compile cache miss", out)
    # snapshots on (the default): the restart restores the server captured after boot 1
    assert re.search(r"boot 2 \(warm, after the kill\): ready in [0-9.]+ s; restored from the snapshot", out)
    assert re.search(r"boot time cold vs warm: [0-9.]+ s -> [0-9.]+ s", out)
    assert "left running: nothing" in out and "result: the demo ran to the end" in out

    # Checked here too, not only taken from the demo's word.
    assert not list(Path("/etc/cdi").glob(f"{CDI_PREFIX}*.yaml"))
    workdirs = re.findall(r"stand-in GPU nodes in (\S+)/gpus/dev", out)
    assert workdirs and not Path(workdirs[0]).exists()
    assert processes_mentioning([workdirs[0], str(run_root(storage_root(PURPOSE), PURPOSE))]) == ()
    env = private_env(tmp_path / "podman", purpose=PURPOSE)
    containers = subprocess.run(
        ["podman", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True, env=env, check=True
    )
    assert containers.stdout.split() == []
    assert workdirs[0].startswith(tempfile.gettempdir())
