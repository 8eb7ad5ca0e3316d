"""`dankserve restart NAME` through the real CLI against a real daemon (process runtime, the stand-in vLLM)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.daemon import dankserve_cli, free_port, process_deployment, running_daemon
from tests.supervisor.test_daemon import alive, server_pid

pytestmark = pytest.mark.slow


def test_restart_stops_the_server_and_boots_a_new_one_and_waits_until_ready(tmp_path: Path) -> None:
    """restart NAME stops the deployment's server, boots a new one through the daemon, and returns once it is
    ready, printing its endpoint; the other deployment keeps its server."""
    with running_daemon(
        tmp_path,
        {"chat": process_deployment(free_port(), gpus=[0]), "other": process_deployment(free_port(), gpus=[1])},
    ) as daemon:
        for name in ("chat", "other"):
            daemon.wait_for(name, lambda d: d["state"] == "ready")
        before, other = server_pid(daemon, "chat"), server_pid(daemon, "other")
        done = dankserve_cli(daemon.config, "restart", "chat", "--timeout", "60")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "chat: stopped; booting it again" in done.stdout
        assert "chat: ready, serving at http://" in done.stdout
        status = daemon.deployment("chat")
        assert status is not None and status["state"] == "ready" and status["boots"] == 2
        assert server_pid(daemon, "chat") != before and not alive(before)
        assert server_pid(daemon, "other") == other and alive(other)


def test_restart_without_a_daemon_says_how_to_start_one(tmp_path: Path) -> None:
    """restart with no daemon running exits 3 and names `dankserve up NAME`; an unknown name exits 2."""
    config = tmp_path / "dankserve.toml"
    config.write_text(f'state_dir = "{tmp_path}/state"\n[deployments.chat]\nmodel = "a/b"\n')
    config.chmod(0o600)
    done = dankserve_cli(config, "restart", "chat")
    assert done.returncode == 3 and "dankserve up chat" in done.stderr, done.stderr
    done = dankserve_cli(config, "restart", "nope")
    assert done.returncode == 2 and "nope" in done.stderr and "chat" in done.stderr
