"""Security: a peer hammering the cluster API with a wrong token cannot flood the daemon's log.

A real daemon with its cluster API (mutual TLS); the peer has a certificate of the group's CA
but the wrong token, as a misconfigured or hostile member would.
"""

from __future__ import annotations

import http.client
from pathlib import Path

import pytest

from tests.harness.certs import group_certs
from tests.harness.daemon import free_port, process_deployment, running_daemon

pytestmark = pytest.mark.slow

TOKEN = "group-token-0123456789abcdef0123"
REQUESTS = 300


def test_wrong_token_refusals_are_logged_throttled_with_their_count(tmp_path: Path) -> None:
    """300 requests with a wrong token: every one answered 401, the log holds one refusal line per 10 s
    (not one per request), each with the count of refusals it stands for."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    certs = group_certs(tmp_path / "certs", ["127.0.0.1"])["127.0.0.1"]
    api_port = free_port()
    cluster = {"listen": f"127.0.0.1:{api_port}", "token_file": str(token), **certs.settings()}
    with running_daemon(
        tmp_path, {"chat": process_deployment(free_port())}, extra_globals={"cluster": cluster}
    ) as daemon:
        daemon.wait_for("chat", lambda d: d["state"] == "ready")
        context = certs.tls().client
        for _ in range(REQUESTS):
            conn = http.client.HTTPSConnection("127.0.0.1", api_port, timeout=5, context=context)
            conn.request("GET", "/v1/status", headers={"Authorization": "Bearer wrong-token-0123456789abcdef"})
            assert conn.getresponse().status == 401
            conn.close()
        refusals = daemon.events_named("cluster_request_refused")
    assert 1 <= len(refusals) <= 3, f"{len(refusals)} refusal lines for {REQUESTS} requests"
    assert refusals[0]["count"] == 1  # the first is logged at once
