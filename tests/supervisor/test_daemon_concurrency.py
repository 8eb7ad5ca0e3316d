"""The daemon's threads: control requests change the workers while the main loop reads them; a reload
never holds up the thread that sends WATCHDOG=1. In-process, over the fake runtime."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dankserve.testing.config_file import write_config
from dankserve.testing.lifecycle import FakeRuntime
from tests.supervisor.test_worker import make_world, ready, wait_for, world_globals


class SlowStopRuntime(FakeRuntime):
    """A runtime whose stop blocks until the test lets it go (a server slow to shut down)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.stopping = threading.Event()

    def stop(self, workload_id: str, timeout: float) -> None:
        self.stopping.set()
        self.release.wait(30)
        super().stop(workload_id, timeout)


def run_main_loop(daemon: Any) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            daemon._main_loop()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread, errors


def test_control_requests_and_the_main_loop_race_without_error(tmp_path: Path) -> None:
    """Hundreds of up/down requests from another thread while the main loop iterates the workers: no error."""
    world = make_world(tmp_path)
    daemon = world.daemon
    daemon._start_worker("chat", daemon.settings.deployments["chat"])
    thread, errors = run_main_loop(daemon)
    for i in range(200):
        reply = daemon.handle_request({"command": "down" if i % 2 else "up", "deployment": "chat"})
        assert reply == {"ok": True}
        daemon.phase_changed()  # the main loop looks at the workers on every change
    daemon.request_stop()
    thread.join(10)
    assert not thread.is_alive() and errors == []
    daemon._stop_all()


@pytest.fixture
def notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> socket.socket:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(0.05)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    monkeypatch.setenv("WATCHDOG_USEC", "400000")  # WATCHDOG=1 at least every 0.2 s
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    return sock


def watchdog_pings(sock: socket.socket, seconds: float) -> int:
    """How many WATCHDOG=1 datagrams arrive within `seconds`."""
    count = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            if b"WATCHDOG=1" in sock.recv(4096).split(b"\n"):
                count += 1
        except TimeoutError:
            continue
    return count


def test_a_reload_that_stops_a_slow_deployment_keeps_the_watchdog_fed(
    tmp_path: Path, notify_socket: socket.socket
) -> None:
    """While a removed deployment's server takes its time to stop, WATCHDOG=1 keeps coming."""
    runtime = SlowStopRuntime()
    world = make_world(tmp_path, runtime=runtime)
    daemon = world.daemon
    daemon._start_worker("chat", daemon.settings.deployments["chat"])
    wait_for(daemon.fleet.snapshot()["chat"], ready)
    thread, errors = run_main_loop(daemon)
    assert watchdog_pings(notify_socket, 0.5) >= 1
    config = daemon.world.config_path
    assert config is not None
    write_config(config, world_globals(tmp_path), {})
    daemon.request_reload()
    assert runtime.stopping.wait(10), "the reload asked the removed deployment to stop"
    pings = watchdog_pings(notify_socket, 1.0)
    runtime.release.set()
    assert pings >= 3, f"only {pings} WATCHDOG=1 in 1 s while a stop was pending"
    daemon.request_stop()
    thread.join(10)
    assert errors == [] and "chat" not in daemon.fleet.snapshot()
    daemon._stop_all()
