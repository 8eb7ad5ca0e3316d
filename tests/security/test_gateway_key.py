"""Security: a keyless gateway in front of a keyed deployment is said to be one (issue 26, finding 10).

The gateway passes a deployment's own key on, so a deployment's `api_key_file` protects nothing
from local users once a gateway without a key fronts it. The real daemon shows it: a request with
no key reaches the keyed server through the gateway. `plan`, `doctor` and the daemon's log say so.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.harness.cli import RECORDED_HOST, dankserve_cli
from tests.harness.daemon import free_port, process_deployment, running_daemon

SAYS = "passes the deployment's key on"
HARDWARE = {"DANKSERVE_HARDWARE": str(RECORDED_HOST)}


@pytest.mark.slow
def test_a_keyless_gateway_in_front_of_a_keyed_deployment_is_reported(tmp_path: Path) -> None:
    """A keyless request gets through the keyless gateway to the keyed server; plan, doctor and the daemon say so."""
    key = tmp_path / "server.key"
    key.write_text("server-key-0123456789\n")
    key.chmod(0o600)
    gateway_port = free_port()
    deployments = {"keyed": process_deployment(free_port(), served_model_name="keyed", api_key_file=str(key))}
    gateway = {"gateway": {"listen": f"127.0.0.1:{gateway_port}"}}
    with running_daemon(tmp_path, deployments, extra_globals=gateway) as daemon:
        daemon.wait_for("keyed", lambda d: d["state"] == "ready")
        request = {"model": "keyed", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        reply = httpx.post(f"http://127.0.0.1:{gateway_port}/v1/chat/completions", json=request, timeout=60)
        assert reply.status_code == 200  # the exposure itself: no key asked of this client
        warned = daemon.events_named("gateway_passes_key")
        assert warned and SAYS in warned[0]["message"], daemon.log_tail()
        plan = dankserve_cli(daemon.config, "plan", "keyed", env=HARDWARE)
        assert plan.returncode == 0, plan.stderr
        assert SAYS in " ".join((plan.stdout + plan.stderr).split())
        doctor = dankserve_cli(daemon.config, "doctor", "--json", env=HARDWARE)
        checks = json.loads(doctor.stdout)["checks"]
        assert any(c["name"] == "gateway key for keyed" and c["verdict"] == "warn" for c in checks), checks
