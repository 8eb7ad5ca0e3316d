"""Tests for dankserve.supervisor.probes.health against a real local HTTP server."""

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from typing import ClassVar

import pytest

from dankserve.backend_address import TcpAddress, connect_host
from dankserve.supervisor.probes.health import (
    HEALTH_RETRY_SECONDS,
    MAX_IDLE_SECONDS,
    BackgroundProbe,
    check_health,
    fetch_metrics,
    idle_seconds,
    token_probe,
)
from tests.harness.wait import hold_for, wait_until


class _Handler(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        body = b'vllm:num_preemptions_total{model_name="m"} 3.0\nvllm:kv_cache_usage_perc 0.25\n'
        self.send_response(self.status if self.path == "/health" else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[http.server.ThreadingHTTPServer]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_200_is_healthy(server: http.server.ThreadingHTTPServer) -> None:
    """A 200 from /health is healthy."""
    _Handler.status = 200
    assert check_health(TcpAddress("127.0.0.1", server.server_address[1])).healthy


def test_503_is_unhealthy_with_status(server: http.server.ThreadingHTTPServer) -> None:
    """vLLM's 503 (engine dead) is reported with its status."""
    _Handler.status = 503
    result = check_health(TcpAddress("127.0.0.1", server.server_address[1]))
    assert not result.healthy
    assert result.status == 503
    _Handler.status = 200


def test_closed_port_has_no_status() -> None:
    """Nothing listening gives no status and an error text."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = check_health(TcpAddress("127.0.0.1", port), timeout=0.5)
    assert result.status is None
    assert result.error


def test_metrics_text_is_fetched(server: http.server.ThreadingHTTPServer) -> None:
    """/metrics comes back as text (serving.parse_serving reads it)."""
    text = fetch_metrics(TcpAddress("127.0.0.1", server.server_address[1]))
    assert text is not None
    assert "vllm:num_preemptions_total" in text


@pytest.mark.parametrize(("bind", "probe"), [("0.0.0.0", "127.0.0.1"), ("::", "::1"), ("127.0.0.2", "127.0.0.2")])
def test_wildcard_binds_are_probed_on_loopback(bind: str, probe: str) -> None:
    """A server bound to every address is probed on loopback."""
    assert connect_host(bind) == probe


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        # (ready, log_says_up, next_health, deadline, now)
        ((False, False, 0.0, 1800.0, 100.0), 0.0),  # the first probe: at once
        ((False, False, 100.4, 1800.0, 100.0), 0.4),  # booting: until the next slow probe
        ((False, False, 101.0, 100.2, 100.0), 0.2),  # ... or the boot deadline, if sooner
        ((False, True, 101.0, 1800.0, 100.0), HEALTH_RETRY_SECONDS),  # the log says up: probe soon
        ((True, True, 102.5, 1800.0, 100.0), MAX_IDLE_SECONDS),  # serving: at most the idle cap
        ((True, False, 100.3, 1800.0, 100.0), 0.3),  # serving: until the next probe
        ((True, True, 99.0, 1800.0, 100.0), 0.0),  # a probe is overdue
    ],
)
def test_idle_seconds(state: tuple[bool, bool, float, float, float], expected: float) -> None:
    """The follow loop sleeps until its next probe or deadline, briefly once the log says the server is up."""
    assert idle_seconds(*state) == pytest.approx(expected)


class _CompletionHandler(http.server.BaseHTTPRequestHandler):
    mode = "ok"
    seen: ClassVar[list[dict[str, object]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        _CompletionHandler.seen.append(
            {
                "body": body,
                "auth": self.headers.get("authorization"),
                "path": self.path,
                "id": self.headers["x-request-id"],
            }
        )
        if self.mode == "hang":
            hold_for(2, "a server that answers long after the probe's 0.3 s timeout")
        payload = b'{"choices": [{"text": "x"}]}' if self.mode in ("ok", "hang") else b'{"error": "boom"}'
        self.send_response({"error": 500, "unsupported": 404}.get(self.mode, 200))
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def completions() -> Iterator[http.server.ThreadingHTTPServer]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CompletionHandler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("ok", None), ("unsupported", None), ("error", "HTTP 500"), ("hang", "no answer within 0.3 s")],
)
def test_token_probe_reports_what_went_wrong(
    completions: http.server.ThreadingHTTPServer, mode: str, expected: str | None
) -> None:
    """A completion that comes back, or a 4xx the API gives without the engine, is None; a 5xx or no answer in
    time is named."""
    _CompletionHandler.mode = mode
    _CompletionHandler.seen = []
    error = token_probe(TcpAddress("127.0.0.1", completions.server_address[1]), "m", "key", timeout=0.3)
    assert error == expected if expected is None else (error is not None and error.startswith(expected))
    sent = _CompletionHandler.seen[0]
    assert sent["auth"] == "Bearer key"
    assert sent["body"] == {"model": "m", "prompt": "ping", "max_tokens": 1, "temperature": 0}
    # marked as dankserve's own in the server's access log and its request ids (issue 39 item 12)
    assert sent["path"] == "/v1/completions?dankserve=liveness-probe"
    assert str(sent["id"]).startswith("dankserve-liveness-probe-")


def test_background_probe_runs_aside_and_reports() -> None:
    """BackgroundProbe is not done while its probe runs, then holds the probe's error."""
    release = threading.Event()
    probe = BackgroundProbe(lambda: "failed" if release.wait(5) else None)
    assert not probe.done
    release.set()
    wait_until(lambda: probe.done, 5, 0.01, what="the probe to finish")
    assert probe.error == "failed"
