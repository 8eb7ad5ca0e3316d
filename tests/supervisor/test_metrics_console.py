"""The web console on `metrics_listen` when no gateway runs (issue 43): the keyless rules, pages and data
for loopback peers only, no actions, and /metrics beside it as before."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from dankserve.logsources import DAEMON_LOG, LogFeed
from dankserve.supervisor.control.metrics_service import console_mount
from dankserve.supervisor.observe.metrics import MetricsServer
from dankserve.testing.lifecycle import FakeRuntime
from tests.gateway.test_console import Daemon, call, daemon_line, read_events
from tests.supervisor.test_metrics import snapshot


def other_address() -> str | None:
    """This host's address on a non-loopback interface (what a peer on the network reaches), if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this picks the outgoing interface
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") else address


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[MetricsServer, Daemon]]:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / DAEMON_LOG).write_text(daemon_line("started"))
    daemon = Daemon()
    runtime = FakeRuntime()
    feed = LogFeed(tmp_path / "state", lambda: {"a": runtime})
    server = MetricsServer("0.0.0.0", 0, snapshot, mounts=[console_mount(daemon, feed)])
    server.start()
    yield server, daemon
    server.close()


def test_console_beside_metrics_for_loopback_peers(served: tuple[MetricsServer, Daemon]) -> None:
    server, daemon = served
    url = f"http://127.0.0.1:{server.port}"
    assert call(url, "/metrics")[0] == 200
    assert call(url, "/ui/")[0] == 200
    status, _, body = call(url, "/ui/api/status")
    assert status == 200 and b'"deployments"' in body
    response, [line] = read_events(url, "/ui/api/logs", "", 1)
    assert "started" in line["message"]
    response.close()
    status, _, body = call(url, "/ui/api/action", body={"action": "sleep", "deployment": "a"})
    assert status == 403 and b"console:admin" in body
    assert [r["command"] for r in daemon.asked] == ["status"]


def test_console_refuses_other_peers(served: tuple[MetricsServer, Daemon]) -> None:
    server, _ = served
    address = other_address()
    if address is None:
        pytest.skip("this host has no non-loopback address")
    url = f"http://{address}:{server.port}"
    assert call(url, "/metrics")[0] == 200  # /metrics keeps its own rule (metrics_api_key_file)
    for path in ("/ui/", "/ui/api/status", "/ui/api/logs"):
        assert call(url, path)[0] == 403
