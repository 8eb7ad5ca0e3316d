"""Security: what the gateway's answers, logs and metrics tell an attacker (issue 38 items 8, 9, 10, 12).

A key holder scoped to one model probes for the others' names (403 vs 404); a client hammers the gateway
with refused requests to flood the journal; a client (or a hostile backend) names headers in `Connection`
to smuggle them past the gateway; a local user scrapes /metrics for key names and each key's use.
Real gateways in front of real stand-in vLLM servers, a real daemon for /metrics.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
import structlog

from dankserve.gateway.backends import Availability
from tests.gateway.conftest import RunningGateway, StandIn, gateway_for, stand_ins  # noqa: F401 (fixtures)
from tests.harness.daemon import free_port, process_deployment, running_daemon

pytestmark = pytest.mark.slow

ALICE, BOB = "sk-alice-0123456789abcdef", "sk-bob-0123456789abcdef"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def keyed(gateway_for: Callable[..., RunningGateway], tmp_path: Path, **settings: Any) -> RunningGateway:  # noqa: F811
    """Alice may use everything; bob only `tiny` (two requests a minute). `a` serves tiny, `b` org/secret."""
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    for name, text in {
        "alice": f'key = "{ALICE}"\nmodels = ["*"]\n',
        "bob": f'key = "{BOB}"\nmodels = ["tiny"]\nrequests_per_minute = 2\n',
    }.items():
        (keys / f"{name}.toml").write_text(text)
        (keys / f"{name}.toml").chmod(0o600)
    deployments = {"a": {"model": "org/tiny", "served_model_name": "tiny"}, "b": {"model": "org/secret"}}
    return gateway_for(deployments, keys_dir=keys, **settings)


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def shape(reply: httpx.Response, model: str) -> tuple[int, str, list[str]]:
    """What an answer tells: status, body with the asked name blanked, header names (less the per-answer ones)."""
    names = sorted(k.lower() for k in reply.headers if k.lower() not in ("date", "x-request-id", "content-length"))
    return reply.status_code, reply.text.replace(model, "NAME"), names


def test_a_scoped_key_cannot_tell_hidden_models_from_missing_ones(
    gateway_for: Callable[..., RunningGateway],  # noqa: F811
    stand_ins: Callable[..., StandIn],  # noqa: F811
    tmp_path: Path,
) -> None:
    """Bob (scope `tiny`) asks for `org/secret` (exists, hidden from him) and `org/nothing` (does not exist):
    the same answer, plain or streamed, on the completion routes and on /v1/models/NAME; both counted as 404s."""
    gateway = keyed(gateway_for, tmp_path)
    secret = stand_ins("org/secret")
    gateway.supervisor.set("b", Availability.READY, secret.port)
    url = gateway.url
    for stream in (False, True):
        hidden = httpx.post(
            url + "/v1/chat/completions", json={**CHAT, "model": "org/secret", "stream": stream}, headers=bearer(BOB)
        )
        missing = httpx.post(
            url + "/v1/chat/completions", json={**CHAT, "model": "org/nothing", "stream": stream}, headers=bearer(BOB)
        )
        assert shape(hidden, "org/secret") == shape(missing, "org/nothing")
        assert hidden.status_code == 404 and hidden.json()["error"]["type"] == "NotFoundError"
    card_hidden = httpx.get(url + "/v1/models/org/secret", headers=bearer(BOB))
    card_missing = httpx.get(url + "/v1/models/org/nothing", headers=bearer(BOB))
    assert shape(card_hidden, "org/secret") == shape(card_missing, "org/nothing")
    assert [m["id"] for m in httpx.get(url + "/v1/models", headers=bearer(BOB)).json()["data"]] == ["tiny"]
    # Alice, whose scope has it, is served: the model is there.
    served = httpx.post(url + "/v1/chat/completions", json={**CHAT, "model": "org/secret"}, headers=bearer(ALICE))
    assert served.status_code == 200, served.text
    assert gateway.access.totals()[("bob", "org/secret")].requests == {404: 2}
    assert secret.metric("vllm:request_success_total") == 1


def test_refused_requests_are_logged_throttled_with_their_count(
    gateway_for: Callable[..., RunningGateway],  # noqa: F811
    stand_ins: Callable[..., StandIn],  # noqa: F811
    tmp_path: Path,
) -> None:
    """300 refused requests (100 keyless 401s, 100 of bob's hidden model, 100 over bob's limit): every one
    answered, each kind logged as one line per 10 s with the count it stands for, not 300 lines."""
    gateway = keyed(gateway_for, tmp_path)
    gateway.supervisor.set("a", Availability.READY, stand_ins("tiny").port)
    url = gateway.url + "/v1/chat/completions"
    with structlog.testing.capture_logs() as logs, httpx.Client() as client:
        codes = [client.post(url, json={**CHAT, "model": "tiny"}).status_code for _ in range(100)]
        codes += [
            client.post(url, json={**CHAT, "model": "org/secret"}, headers=bearer(BOB)).status_code for _ in range(100)
        ]
        codes += [client.post(url, json={**CHAT, "model": "tiny"}, headers=bearer(BOB)).status_code for _ in range(102)]
    assert set(codes[:100]) == {401} and set(codes[100:200]) <= {403, 404} and codes.count(429) == 100
    for event in ("gateway_denied", "gateway_forbidden", "gateway_limited"):
        lines = [entry for entry in logs if entry["event"] == event]
        assert 1 <= len(lines) <= 3, f"{len(lines)} {event} lines for 100 requests"
        assert lines[0]["count"] == 1  # the first is logged at once
    assert len(logs) < 20, [entry["event"] for entry in logs]


class _Recorder(http.server.BaseHTTPRequestHandler):
    """A backend that keeps the headers it was sent and answers a completion naming a header hop-by-hop."""

    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[dict[str, str]]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        _Recorder.seen.append({k.lower(): v for k, v in self.headers.items()})
        body = json.dumps({"id": "cmpl-1", "object": "chat.completion", "choices": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "keep-alive, X-Backend-Internal")
        self.send_header("X-Backend-Internal", "internal-token")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Recorder.seen = []
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_headers_named_in_connection_go_no_further(
    gateway_for: Callable[..., RunningGateway],  # noqa: F811
    recorder: int,
) -> None:
    """A client's `Connection: keep-alive, X-Forwarded-For, X-Tenant` makes those two hop-by-hop (RFC 9110
    7.6.1): the backend never sees them; the backend's own `Connection`-named header never reaches the client."""
    gateway = gateway_for({"a": {"model": "org/tiny", "served_model_name": "tiny"}})
    gateway.supervisor.set("a", Availability.READY, recorder)
    headers = {
        "Connection": "keep-alive, X-Forwarded-For, X-Tenant",
        "X-Forwarded-For": "10.0.0.1",
        "X-Tenant": "admin",
        "X-Kept": "yes",
    }
    reply = httpx.post(gateway.url + "/v1/chat/completions", json={**CHAT, "model": "tiny"}, headers=headers)
    assert reply.status_code == 200, reply.text
    seen = _Recorder.seen[0]
    assert "x-forwarded-for" not in seen and "x-tenant" not in seen
    assert seen["x-kept"] == "yes"
    assert "x-backend-internal" not in {k.lower() for k in reply.headers}


def test_metrics_without_a_key_shows_no_key_names(tmp_path: Path) -> None:
    """A daemon with gateway keys and /metrics without metrics_api_key_file (on loopback: any local user may
    scrape it): the gateway's counters are there, all keys as one `key="*"`, no key's name or value."""
    gateway_port, metrics_port = free_port(), free_port()
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    (keys / "alice-ops.toml").write_text(f'key = "{ALICE}"\nmodels = ["*"]\n')
    (keys / "alice-ops.toml").chmod(0o600)
    extra = {
        "gateway": {"listen": f"127.0.0.1:{gateway_port}", "keys_dir": str(keys)},
        "metrics_listen": f"127.0.0.1:{metrics_port}",
    }
    deployments = {"chat": process_deployment(free_port(), served_model_name="tiny-chat", gpus=[0])}
    request = {**CHAT, "model": "tiny-chat"}
    with running_daemon(tmp_path, deployments, extra_globals=extra) as daemon:
        daemon.wait_for("chat", lambda d: d["phase"] == "ready")
        url = f"http://127.0.0.1:{gateway_port}/v1/chat/completions"
        assert httpx.post(url, json=request, headers=bearer(ALICE), timeout=30).status_code == 200
        assert httpx.post(url, json=request, timeout=30).status_code == 401
        metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    assert 'dankserve_gateway_requests_total{code="200",key="*",model="tiny-chat"} 1.0' in metrics
    assert 'dankserve_gateway_requests_total{code="401",key="-",model="-"} 1.0' in metrics
    assert "alice" not in metrics and ALICE not in metrics
