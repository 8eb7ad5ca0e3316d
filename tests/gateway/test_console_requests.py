"""The console's recent requests (`/ui/api/requests`) on a real gateway in front of a stand-in server: each
request as it ended, newest first, bounded, key names only for `console:admin`, no prompt text (issue 43)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dankserve.aioserver import GuardedServer
from dankserve.gateway.backends import Availability
from dankserve.gateway.recent_requests import RECENT_REQUESTS
from dankserve.gateway.service import start_gateway
from dankserve.settings import DeploymentSettings, GatewaySettings
from tests.gateway.conftest import StandIn, TableSupervisor
from tests.gateway.test_access import write_keys
from tests.gateway.test_console import ADMIN, API, READER, Daemon
from tests.harness.daemon import free_port
from tests.harness.wait import hold_for, wait_until

PROMPT = "a secret prompt that never leaves the gateway"


@pytest.fixture
def served(tmp_path: Path, stand_ins: Callable[..., StandIn]) -> Iterator[tuple[str, TableSupervisor, StandIn]]:
    server = stand_ins("tiny")
    keys = write_keys(
        tmp_path / "keys",
        reader=f'key = "{READER}"\nscopes = ["console"]',
        admin=f'key = "{ADMIN}"\nscopes = ["console:admin", "api"]',
        api=f'key = "{API}"',
    )
    supervisor = TableSupervisor()
    deps = {"a": DeploymentSettings(model="test/tiny", served_model_name="tiny")}
    settings = GatewaySettings(listen=f"127.0.0.1:{free_port()}", keys_dir=keys, queue_timeout_seconds=30)
    gateway: GuardedServer = start_gateway(settings, lambda: deps, supervisor, console=Daemon())[0]
    host, port = gateway.address
    yield f"http://{host}:{port}", supervisor, server
    gateway.close()


def complete(url: str, key: str, **more: Any) -> httpx.Response:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 5, **more}
    return httpx.post(f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def recent(url: str, key: str, **headers: str) -> httpx.Response:
    return httpx.get(f"{url}/ui/api/requests", headers={"Authorization": f"Bearer {key}", **headers}, timeout=10)


def test_each_request_with_its_times_and_tokens(served: tuple[str, TableSupervisor, StandIn]) -> None:
    url, supervisor, server = served
    supervisor.set("a", Availability.PENDING, server.port)  # booting: the request waits in the gateway's queue
    looked = len(supervisor.looks)

    def ready_once_it_waits() -> None:  # (a 0.5 s timer was once too short under CI's load: nothing waited)
        wait_until(lambda: len(supervisor.looks) > looked, 30, 0.01, what="the request at the gateway")
        hold_for(0.3, "the request waits in the gateway's queue: its queued time is the point")
        supervisor.set("a", Availability.READY, server.port)

    ready = threading.Thread(target=ready_once_it_waits)
    ready.start()
    assert complete(url, API).status_code == 200
    ready.join()
    assert complete(url, API, stream=True).status_code == 200
    assert complete(url, "sk-wrong-0123456789abcdef").status_code == 401
    answer = recent(url, ADMIN)
    assert answer.status_code == 200 and PROMPT not in answer.text and API not in answer.text
    streamed, waited, *_ = [r for r in answer.json()["requests"] if r["status"] == 200]
    refused = answer.json()["requests"][0]
    assert (refused["status"], refused["key"], refused["total_seconds"], refused["prompt_tokens"]) == (
        401,
        "-",
        None,
        None,
    )
    assert (waited["key"], waited["model"]) == ("api", "tiny")
    # Held by the test until the deployment turned ready, 0.3 s after the gateway first looked it up.
    assert 0 < waited["queued_seconds"] <= waited["total_seconds"]
    assert streamed["queued_seconds"] < waited["queued_seconds"]
    for entry in (waited, streamed):
        assert 0 < entry["first_byte_seconds"] <= entry["total_seconds"]
        assert entry["prompt_tokens"] > 0 and entry["completion_tokens"] == 5
    assert waited["at"] <= streamed["at"] <= refused["at"] <= time.time()


def test_key_names_only_for_console_admin(served: tuple[str, TableSupervisor, StandIn]) -> None:
    url, supervisor, server = served
    supervisor.set("a", Availability.READY, server.port)
    assert complete(url, API).status_code == 200
    assert [r["key"] for r in recent(url, ADMIN).json()["requests"]] == ["api"]
    assert [r["key"] for r in recent(url, READER).json()["requests"]] == ["*"]  # as /metrics without its key
    usage = httpx.get(f"{url}/ui/api/usage", headers={"Authorization": f"Bearer {READER}"}, timeout=10).json()
    assert [r["key"] for r in usage["rows"]] == ["*"]
    assert recent(url, API).status_code == 403  # a key without the console scope
    assert httpx.get(f"{url}/ui/api/requests", timeout=10).status_code == 401


def test_bounded_and_unchanged_answers_are_304(served: tuple[str, TableSupervisor, StandIn]) -> None:
    url, _, _ = served
    with httpx.Client(timeout=10) as client:
        for _ in range(RECENT_REQUESTS + 5):
            assert client.get(f"{url}/v1/models", headers={"Authorization": "Bearer sk-nope"}).status_code == 401
    first = recent(url, READER)
    assert len(first.json()["requests"]) == RECENT_REQUESTS and first.json()["kept"] == RECENT_REQUESTS
    again = recent(url, READER, **{"If-None-Match": first.headers["ETag"]})
    assert again.status_code == 304 and again.content == b""
    assert "script-src 'self'" in again.headers["Content-Security-Policy"]
    json.dumps(first.json())  # plain JSON
