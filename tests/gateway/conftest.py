"""Real stand-in vLLM servers (processes) and a gateway in front of them, for the gateway tests."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dankserve.aioserver import GuardedServer
from dankserve.backend_address import TcpAddress
from dankserve.gateway.access import Access
from dankserve.gateway.backends import Availability, Backend
from dankserve.gateway.service import start_gateway
from dankserve.settings import DeploymentSettings, GatewaySettings
from tests.harness.daemon import STAND_IN, free_port
from tests.harness.wait import wait_until


@dataclass
class StandIn:
    """One stand-in vLLM server process on loopback."""

    port: int
    proc: subprocess.Popen[bytes]

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def start_stand_in(served: str, *args: str, token_seconds: float = 0.0, env: dict[str, str] | None = None) -> StandIn:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(STAND_IN),
            "serve",
            "test/tiny",
            "--port",
            str(port),
            "--served-model-name",
            served,
            *args,
        ],
        env={
            **os.environ,
            "FAKE_VLLM_TIME_SCALE": "0.01",
            "FAKE_VLLM_TOKEN_SECONDS": str(token_seconds),
            **(env or {}),
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return True
        except OSError:
            return False

    try:
        wait_until(healthy, 60, 0.1, what="the stand-in healthy")
    except AssertionError:
        proc.kill()
        raise
    return StandIn(port, proc)


@pytest.fixture
def stand_ins() -> Iterator[Callable[..., StandIn]]:
    """Start stand-in servers; all are stopped after the test."""
    started: list[StandIn] = []

    def start(served: str, *args: str, **kwargs: Any) -> StandIn:
        server = start_stand_in(served, *args, **kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        server.proc.terminate()
    for server in started:
        try:
            server.proc.wait(10)
        except subprocess.TimeoutExpired:
            server.proc.kill()


@dataclass
class TableSupervisor:
    """The supervisor seam: availability set by the test, wakes recorded."""

    backends: dict[str, Backend] = field(default_factory=dict)
    wakes: list[str] = field(default_factory=list)
    touches: list[str] = field(default_factory=list)
    releases: list[str] = field(default_factory=list)
    looks: list[str] = field(default_factory=list)
    """Every `backend` asked for: a request has reached the gateway once its deployment is looked up."""

    def backend(self, deployment: str) -> Backend:
        self.looks.append(deployment)
        return self.backends.get(deployment, Backend(Availability.OFF, None, message="unknown"))

    def wake(self, deployment: str) -> None:
        self.wakes.append(deployment)

    def touched(self, deployment: str) -> None:
        self.touches.append(deployment)

    def released(self, deployment: str) -> None:
        self.releases.append(deployment)

    def set(
        self, deployment: str, availability: Availability, port: int = 0, api_key: str | None = None, **more: Any
    ) -> None:
        """`more`: Backend's other fields (state, ready_in, held_for)."""
        self.backends[deployment] = Backend(
            availability,
            TcpAddress("127.0.0.1", port),
            api_key,
            message=more.pop("message", availability.value),
            **more,
        )


@dataclass
class RunningGateway:
    server: GuardedServer
    supervisor: TableSupervisor
    deployments: dict[str, DeploymentSettings]
    access: Access
    settings: GatewaySettings

    def reload_keys(self) -> None:
        """What an accepted reload does: the key files read again and put in force (ConfigError: refused)."""
        self.access.prepare_reload(self.settings)()

    @property
    def url(self) -> str:
        host, port = self.server.address
        return f"http://{host}:{port}"


@pytest.fixture
def gateway_for(tmp_path: Path) -> Iterator[Callable[..., RunningGateway]]:
    """A gateway over the given deployments (name -> settings dict), with a TableSupervisor."""
    servers: list[GuardedServer] = []

    def make(deployments: dict[str, dict[str, Any]], usage_file: Path | None = None, **settings: Any) -> RunningGateway:
        deps = {name: DeploymentSettings(**values) for name, values in deployments.items()}
        supervisor = TableSupervisor()
        gateway_settings = GatewaySettings(listen=f"127.0.0.1:{free_port()}", **settings)
        server, access = start_gateway(gateway_settings, lambda: deps, supervisor, usage_file=usage_file)
        servers.append(server)
        return RunningGateway(server, supervisor, deps, access, gateway_settings)

    yield make
    for server in servers:
        server.close()
