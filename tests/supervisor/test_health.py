"""Tests for dankserve.supervisor.health against a real local HTTP server."""

import http.server
import socket
import threading
from collections.abc import Iterator

import pytest

from dankserve.supervisor.health import (
    HEALTH_RETRY_SECONDS,
    MAX_IDLE_SECONDS,
    check_health,
    fetch_metrics,
    idle_seconds,
    probe_host_for,
)


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
    assert check_health("127.0.0.1", server.server_address[1]).healthy


def test_503_is_unhealthy_with_status(server: http.server.ThreadingHTTPServer) -> None:
    """vLLM's 503 (engine dead) is reported with its status."""
    _Handler.status = 503
    result = check_health("127.0.0.1", server.server_address[1])
    assert not result.healthy
    assert result.status == 503
    _Handler.status = 200


def test_closed_port_has_no_status() -> None:
    """Nothing listening gives no status and an error text."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = check_health("127.0.0.1", port, timeout=0.5)
    assert result.status is None
    assert result.error


def test_metrics_text_is_fetched(server: http.server.ThreadingHTTPServer) -> None:
    """/metrics comes back as text (serving.parse_serving reads it)."""
    text = fetch_metrics("127.0.0.1", server.server_address[1])
    assert text is not None
    assert "vllm:num_preemptions_total" in text


@pytest.mark.parametrize(("bind", "probe"), [("0.0.0.0", "127.0.0.1"), ("::", "::1"), ("127.0.0.2", "127.0.0.2")])
def test_wildcard_binds_are_probed_on_loopback(bind: str, probe: str) -> None:
    """A server bound to every address is probed on loopback."""
    assert probe_host_for(bind) == probe


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
