"""A real dankserve daemon in a subprocess, with a real sd_notify socket, for end-to-end tests.

The daemon runs `python -m dankserve --config FILE run --hardware FILE` exactly as systemd
would start it; the test binds NOTIFY_SOCKET (a datagram socket) and records every message with
its arrival time, and asks the daemon for its status over the control socket.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from dankserve import control
from dankserve.testing import HOSTS_DIR, write_recorded_host
from dankserve.testing.config_file import write_config
from tests.harness.cli import dankserve_cli
from tests.harness.wait import wait_until

__all__ = [
    "Notifications",
    "RunningDaemon",
    "daemon_globals",
    "dankserve_cli",
    "free_port",
    "launcher_deployment",
    "process_deployment",
    "running_daemon",
    "write_config",
    "write_host",
]

REPO = Path(__file__).resolve().parents[2]
STAND_IN = REPO / "containers" / "fake-vllm" / "vllm.py"
BASE_HOST = HOSTS_DIR / "h200x2-vm-real.json"

# A small Llama-shaped model, declared (no HF cache in tests).
MODEL_FACTS = {
    "parameter_bytes": 2_000_000_000,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 16,
    "head_dim": 64,
    "max_position_embeddings": 8192,
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def server_socket(tmp_path: Path, deployment: str) -> Path:
    """The private unix socket a test daemon's deployment serves on behind its gateway (listen = auto)."""
    from dankserve.planning import SERVER_SOCKET, backend_dir
    from dankserve.settings import Settings

    return backend_dir(Settings(state_dir=tmp_path / "state"), deployment) / SERVER_SOCKET


def socket_client(path: Path, timeout: float = 30.0) -> httpx.Client:
    """An httpx client of the server on unix socket `path` (relative URLs: `client.get("/health")`)."""
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), base_url="http://localhost", timeout=timeout)


def write_host(path: Path, uuids: Sequence[str] | None = None, free_fraction: float = 0.996) -> Path:
    """A recorded two-H200 host (from a real one), optionally with the stand-in GPUs' UUIDs."""
    return write_recorded_host(path, BASE_HOST.stem, uuids, free_fraction)


def process_deployment(port: int, **extra: Any) -> dict[str, Any]:
    """A deployment running the stand-in as a plain process. Snapshots off unless a test turns them on
    (`snapshot="auto"`): the tests of restarts mean a boot (tests/supervisor/test_daemon_snapshots.py
    tests the restores)."""
    env = {"FAKE_VLLM_TIME_SCALE": "0.02", **extra.pop("env", {})}
    return {
        "model": "test/tiny",
        "runtime": "process",
        "executable": str(STAND_IN),
        "port": port,
        "env": env,
        "model_facts": MODEL_FACTS,
        "snapshot": "off",
        **extra,
    }


LAUNCHER_ENV = {
    # The stand-in's CLI stands for vLLM's (`vllm.entrypoints.cli.main:main`, the launcher's default).
    "DANKSERVE_LAUNCHER_ENTRY": "fake_vllm.cli:main",
    "DANKSERVE_LAUNCHER_PRELOAD": "fake_vllm.cli",
}


def launcher_deployment(port: int, **extra: Any) -> dict[str, Any]:
    """A deployment running the stand-in under the launcher, as a process (its package on the launcher's path)."""
    env = {**LAUNCHER_ENV, "DANKSERVE_LAUNCHER_PATH": str(STAND_IN.parent), **extra.pop("env", {})}
    return process_deployment(port, launcher=True, env=env, **extra)


def container_deployment(image: str, port: int, **extra: Any) -> dict[str, Any]:
    """A deployment running the stand-in image in a container (the image must be present). Snapshots and the
    launcher off unless a test turns them on, as for `process_deployment`: a restart here is a boot of a new
    container (with snapshots it is a restore, test_daemon_snapshots_podman.py; with the launcher, which
    `launcher = "auto"` picks for the image's `vllm serve` once snapshots are off, a new server in the same
    container, test_daemon_podman_launcher.py)."""
    env = {"FAKE_VLLM_TIME_SCALE": "0.02", **extra.pop("env", {})}
    return {
        "model": "test/tiny",
        "image": image,
        "pull": "never",
        "port": port,
        "env": env,
        "model_facts": MODEL_FACTS,
        "snapshot": "off",
        "launcher": False,
        **extra,
    }


@dataclass
class Notifications:
    """What the daemon said on NOTIFY_SOCKET, with arrival times (time.time())."""

    path: Path
    messages: list[tuple[float, str]] = field(default_factory=list)
    _sock: socket.socket | None = None
    _thread: threading.Thread | None = None

    def start(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(self.path))
        sock.settimeout(0.2)
        self._sock = sock
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._sock is not None
        while True:
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            self.messages.append((time.time(), data.decode()))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self.path.unlink(missing_ok=True)  # so a test may start another daemon in the same directory

    def first(self, assignment: str) -> float | None:
        """Arrival time of the first message holding `assignment` (e.g. READY=1)."""
        for at, text in self.messages:
            if assignment in text.split("\n"):
                return at
        return None


@dataclass
class RunningDaemon:
    """A dankserve daemon started by a test."""

    config: Path
    hardware: Path
    state_dir: Path
    log_path: Path
    notifications: Notifications
    proc: subprocess.Popen[bytes] | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    log_format: str = "json"
    nofile: int | None = None
    """The daemon's soft RLIMIT_NOFILE at start (None: this process's), e.g. a login shell's 1024."""

    def start(self) -> RunningDaemon:
        env = {
            **os.environ,
            "NOTIFY_SOCKET": str(self.notifications.path),
            "PYTHONUNBUFFERED": "1",
            "PYTHONFAULTHANDLER": "1",  # SIGABRT (a stop that hangs, below) prints every thread's stack
            **self.extra_env,
        }
        env.pop("DANKSERVE_CONFIG", None)
        argv = [sys.executable, "-m", "dankserve", "--config", str(self.config), "run"]
        argv += ["--hardware", str(self.hardware), "--log-format", self.log_format]
        self.log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        soft = self.nofile

        def limit() -> None:
            if soft is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
                preexec_fn=limit,  # noqa: PLW1509 (one setrlimit call, no lock taken)
            )
        return self

    def status(self) -> dict[str, Any] | None:
        reply = control.request(control.socket_path(self.state_dir), {"command": "status"}, timeout=5)
        if reply is None or not reply.get("ok"):
            return None
        status: dict[str, Any] = reply["status"]
        return status

    def deployment(self, name: str) -> dict[str, Any] | None:
        status = self.status()
        if status is None:
            return None
        return next((d for d in status["deployments"] if d["name"] == name), None)

    def wait_for(self, name: str, predicate: Callable[[dict[str, Any]], bool], timeout: float = 60) -> dict[str, Any]:
        """Poll the deployment's status until `predicate` holds; its status then."""
        last: dict[str, Any] | None = None

        def met() -> dict[str, Any] | None:
            nonlocal last
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(OSError, ValueError):
                last = self.deployment(name)
            return last if last is not None and predicate(last) else None

        return wait_until(
            met, timeout, 0.05, what=lambda: f"{name}: the condition; last status {last}\n{self.log_tail()}"
        )

    def request(self, message: dict[str, Any]) -> dict[str, Any] | None:
        return control.request(control.socket_path(self.state_dir), message, timeout=120)

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run the real `dankserve --config CONFIG ARGS...` against this daemon; its exit code and output."""
        return dankserve_cli(self.config, *args, env=self.extra_env, timeout=timeout)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 120) -> int:
        """SIGTERM and wait; the exit code. (The daemon's own bound, with the test settings' 10 s stop timeout: the
        workers' 25 s, each listener's 10 s, the coordinator's and the observatory's 5 s, and Podman's answers;
        the unit gives it 150 s.)"""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            # Say what the daemon was doing when it would not stop (a bare TimeoutExpired tells nothing):
            # SIGABRT makes faulthandler write every thread's stack into the log.
            self.proc.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
            tail = self.log_tail(200)
            raise AssertionError(f"the daemon did not exit within {timeout} s of SIGTERM:\n{tail}") from None

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def events(self) -> list[dict[str, Any]]:
        """The daemon's JSON log lines."""
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                item = json.loads(line)
                if isinstance(item, dict):
                    out.append(item)
        return out

    def events_named(self, event: str) -> list[dict[str, Any]]:
        """The daemon's JSON log lines of one event."""
        return [e for e in self.events() if e.get("event") == event]

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def daemon_globals(tmp_path: Path, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The global settings of a test daemon: its dirs under tmp_path, quick restarts and probes."""
    return {
        "state_dir": str(tmp_path / "state"),
        "cache_dir": str(tmp_path / "cache"),
        "hf_cache_dir": str(tmp_path / "hf"),
        "vllm_version": "0.33.0",
        "restart_backoff_initial_seconds": 0.2,
        "restart_jitter_seconds": 0.1,
        "health_interval_seconds": 1.0,
        "stop_timeout_seconds": 10.0,
        **(extra or {}),
    }


@contextlib.contextmanager
def running_daemon(
    tmp_path: Path,
    deployments: Mapping[str, Mapping[str, Any]],
    *,
    hardware: Path | None = None,
    extra_globals: Mapping[str, Any] | None = None,
    extra_env: Mapping[str, str] | None = None,
    log_format: str = "json",
    log_in_state_dir: bool = False,
    nofile: int | None = None,
) -> Iterator[RunningDaemon]:
    """Start a daemon for these deployments; stop it (and check it exits 0) afterwards. Its output goes
    to tmp_path/daemon.log, or (`log_in_state_dir`) where `dankserve up` puts a background daemon's."""
    config = write_config(tmp_path / "dankserve.toml", daemon_globals(tmp_path, extra_globals), deployments)
    hw = hardware or write_host(tmp_path / "host.json")
    notifications = Notifications(tmp_path / "notify.sock")
    notifications.start()
    log_path = tmp_path / "state" / "daemon.log" if log_in_state_dir else tmp_path / "daemon.log"
    daemon = RunningDaemon(
        config,
        hw,
        tmp_path / "state",
        log_path,
        notifications,
        extra_env=extra_env or {},
        log_format=log_format,
        nofile=nofile,
    ).start()
    try:
        yield daemon
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop()
        notifications.close()
