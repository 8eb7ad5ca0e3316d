"""The gateway passes requests to a server on its private unix socket (issue 38: `listen = "socket"`), streamed
or not, with the deployment's key; a socket nobody listens on is a 502 naming the deployment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from dankserve.backend_address import UnixAddress
from dankserve.gateway.backends import Availability, Backend
from tests.gateway.conftest import RunningGateway
from tests.harness.daemon import STAND_IN, socket_client
from tests.harness.wait import wait_until


@pytest.fixture
def socket_stand_in(tmp_path: Path) -> Iterator[Path]:
    """The stand-in serving `tiny` on a unix socket (`--uds`) with an API key; its socket's path."""
    path = tmp_path / "backend" / "vllm.sock"
    path.parent.mkdir(mode=0o700)
    argv = [sys.executable, str(STAND_IN), "serve", "test/tiny", "--uds", str(path), "--served-model-name", "tiny"]
    env = {**os.environ, "FAKE_VLLM_TIME_SCALE": "0.01", "VLLM_API_KEY": "sk-backend"}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:

        def healthy() -> bool:
            try:
                with socket_client(path, timeout=1) as server:
                    return server.get("/health").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, 60, 0.1, what="the stand-in healthy on its socket")
        yield path
    finally:
        proc.kill()
        proc.wait()


def test_requests_reach_a_server_on_its_socket(
    gateway_for: Callable[..., RunningGateway], socket_stand_in: Path, tmp_path: Path
) -> None:
    gateway = gateway_for({"a": {"model": "test/tiny", "served_model_name": "tiny"}})
    ready = Backend(Availability.READY, UnixAddress(socket_stand_in), "sk-backend", state="ready", ready_in=0.0)
    gateway.supervisor.backends["a"] = ready
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 3}
    reply = httpx.post(gateway.url + "/v1/completions", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == "tiny"
    with httpx.stream("POST", gateway.url + "/v1/completions", json={**body, "stream": True}, timeout=30) as stream:
        events = [line[6:] for line in stream.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and all("choices" in json.loads(e) for e in events[:-1]), events

    gone = Backend(Availability.READY, UnixAddress(tmp_path / "nobody.sock"), state="ready", ready_in=0.0)
    gateway.supervisor.backends["a"] = gone
    refused = httpx.post(gateway.url + "/v1/completions", json=body, timeout=30)
    assert refused.status_code == 502 and "deployment 'a' did not answer" in refused.text, refused.text
