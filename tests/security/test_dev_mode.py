"""Security: vLLM's dev mode is dankserve's alone (issue 26, finding 4).

`env = { VLLM_SERVER_DEV_MODE = "1" }` exposed /sleep and /collective_rpc without the key on a
deployment reachable from other hosts: it is refused at validation (exit 2). Dankserve turns dev
mode on itself only for a swap group member, which must listen on loopback; there any local user
can still POST /sleep, and the daemon used to go on reporting `ready` while the server slept. It
now notices on its next health check, says so, and wakes the server.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.harness.cli import RECORDED_HOST, dankserve_cli
from tests.harness.daemon import free_port, process_deployment, running_daemon
from tests.harness.wait import wait_until
from tests.security.test_config import DEPLOYMENT, config


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_dev_mode_in_env_is_refused(tmp_path: Path, host: str) -> None:
    """VLLM_SERVER_DEV_MODE in a deployment's env: the daemon exits 2 naming it, on loopback or beyond."""
    key = tmp_path / "api.key"
    key.write_text("sk-dev-mode-test\n")
    key.chmod(0o600)
    extra = f'host = "{host}"\napi_key_file = "{key}"\nenv = {{ VLLM_SERVER_DEV_MODE = "1" }}\n'
    path = config(tmp_path, DEPLOYMENT.replace('model = "m"\n', 'model = "m"\n' + extra))
    done = dankserve_cli(path, "run", "--hardware", str(RECORDED_HOST), timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "VLLM_SERVER_DEV_MODE" in done.stderr and "/collective_rpc" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_sleep_the_daemon_did_not_ask_for_is_reported_and_undone(tmp_path: Path) -> None:
    """A local POST /sleep to a swap group member: the daemon logs slept_unasked, says it in status, wakes it."""
    port = free_port()
    deployments = {"chat": process_deployment(port, swap_group="g")}
    with running_daemon(tmp_path, deployments, extra_globals={"health_interval_seconds": 0.3}) as daemon:
        daemon.wait_for("chat", lambda d: d["state"] == "ready")
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(base + "/is_sleeping", timeout=5).json() == {"is_sleeping": False}
        assert httpx.post(base + "/sleep?level=1", timeout=30).status_code == 200
        wait_until(lambda: daemon.events_named("slept_unasked"), 30, 0.1, what=daemon.log_tail)
        chat = daemon.wait_for("chat", lambda d: d["state"] == "ready" and d["phase"] == "ready", timeout=30)
        assert "without dankserve asking" in (chat.get("message") or ""), chat
        assert httpx.get(base + "/is_sleeping", timeout=5).json() == {"is_sleeping": False}
        assert chat["boots"] == 1 and chat["restarts"] == 0
