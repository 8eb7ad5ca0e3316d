"""Observability end to end with the stand-in as a process: preemption warnings in the log and in `dankserve
status` (with the advice, at most once per interval), and a metrics address already in use."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dankserve.supervisor.observe.serving import PREEMPTION_ADVICE
from tests.harness.daemon import free_port, process_deployment, running_daemon
from tests.harness.wait import hold_for

pytestmark = pytest.mark.slow


def test_rising_preemptions_are_warned_about_once_per_interval(tmp_path: Path) -> None:
    """Preemptions rising every 0.3 s give one warning per 2 s interval, in the log and in status."""
    env = {
        "FAKE_VLLM_PREEMPTIONS_PER_INTERVAL": "2",
        "FAKE_VLLM_STATS_INTERVAL_SECONDS": "0.3",
        "FAKE_VLLM_KV_USAGE": "97",
    }
    settings = {"serving_scrape_interval_seconds": 0.3, "preemption_warning_interval_seconds": 2.0}
    with running_daemon(tmp_path, {"chat": process_deployment(free_port(), env=env)}, extra_globals=settings) as daemon:
        daemon.wait_for("chat", lambda d: d["state"] == "ready")
        started = time.monotonic()
        status = daemon.wait_for("chat", lambda d: d.get("preemption_warning") is not None, timeout=30)
        assert PREEMPTION_ADVICE in status["preemption_warning"]["message"]
        assert status["serving"]["preemptions"] > 0 and status["serving"]["kv_cache_usage_perc"] == 0.97
        # the rate is the point: 5 s more of rising preemptions, so at most one warning per 2 s interval
        hold_for(5, "preemptions keep rising across two more warning intervals")
        warnings = [e for e in daemon.events() if e.get("event") == "preemptions"]
        elapsed = time.monotonic() - started
        assert 1 <= len(warnings) <= elapsed / 2 + 1
        assert all(PREEMPTION_ADVICE in w["advice"] for w in warnings)
        done = subprocess.run(
            [sys.executable, "-m", "dankserve", "--config", str(daemon.config), "status", "chat"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "preemptions while serving" in done.stderr and "max_num_seqs" in done.stderr
        assert "serving: " in done.stdout and "KV cache 97% used" in done.stdout


def test_metrics_address_in_use_stops_the_daemon_with_exit_3(tmp_path: Path) -> None:
    """A metrics_listen port another process holds is an environment error naming the address and the fix."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = f"127.0.0.1:{taken.getsockname()[1]}"
        deployment = process_deployment(free_port())
        with running_daemon(tmp_path, {"chat": deployment}, extra_globals={"metrics_listen": listen}) as daemon:
            assert daemon.proc is not None
            assert daemon.proc.wait(60) == 3
            assert f"cannot serve metrics on {listen}" in daemon.log_tail()
