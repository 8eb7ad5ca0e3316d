"""Keys, scopes, limits, usage and admission through the real gateway, stand-in servers and the real `openai`
client (issue 31 items 1 and 4)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from dankserve.errors import ConfigError
from dankserve.gateway.backends import Availability
from dankserve.gateway.usage_store import read_usage
from tests.gateway.conftest import RunningGateway, StandIn
from tests.harness.wait import hold_for, wait_until

pytestmark = pytest.mark.slow

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
QUEUE_JOIN_SECONDS = 0.2
"""Time for requests sent together to reach the gateway's queue, which no endpoint shows."""
ALICE, BOB, CAROL = "sk-alice-0123456789abcdef", "sk-bob-0123456789abcdef", "sk-carol-0123456789abcdef"


def deployments() -> dict[str, dict[str, Any]]:
    return {
        "a": {"model": "org/tiny-a", "served_model_name": "tiny", "aliases": ["gpt-4o-mini"]},
        "b": {"model": "org/other"},
    }


def write_keys(directory: Path, **files: str) -> Path:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for old in directory.glob("*.toml"):
        old.unlink()
    for name, text in files.items():
        path = directory / f"{name}.toml"
        path.write_text(text)
        path.chmod(0o600)
    return directory


def auth(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def keyed_gateway(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn], tmp_path: Path, **more: Any
) -> tuple[RunningGateway, StandIn]:
    keys = write_keys(
        tmp_path / "keys",
        alice=f'key = "{ALICE}"\nmodels = ["*"]',
        bob=f'key = "{BOB}"\nmodels = ["tiny"]\nrequests_per_minute = 2',
    )
    server = stand_ins("tiny", **more.pop("stand_in", {}))
    gateway = gateway_for(deployments(), keys_dir=keys, usage_file=tmp_path / "usage.json", **more)
    gateway.supervisor.set("a", Availability.READY, server.port)
    return gateway, server


def test_401_404_429_in_openai_shape(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn], tmp_path: Path
) -> None:
    """No or unknown key 401; a model outside the key's globs 404 as an unknown one (issue 38 item 8); over a
    limit 429 with Retry-After."""
    gateway, _ = keyed_gateway(gateway_for, stand_ins, tmp_path)
    url = gateway.url + "/v1/chat/completions"
    missing = httpx.post(url, json=CHAT)
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "AuthenticationError"
    assert httpx.post(url, json=CHAT, headers=auth(ALICE + "x")).status_code == 401
    assert httpx.post(url, json=CHAT, headers=auth(ALICE)).status_code == 200
    forbidden = httpx.post(url, json={**CHAT, "model": "gpt-4o-mini"}, headers=auth(BOB))
    assert forbidden.status_code == 404
    assert forbidden.json()["error"] == {
        "message": "The model `gpt-4o-mini` does not exist.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }
    assert [httpx.post(url, json=CHAT, headers=auth(BOB)).status_code for _ in range(2)] == [200, 200]
    limited = httpx.post(url, json=CHAT, headers=auth(BOB))
    assert limited.status_code == 429 and limited.json()["error"]["type"] == "RateLimitError"
    assert 1 <= int(limited.headers["Retry-After"]) <= 30
    assert "requests_per_minute" in limited.json()["error"]["message"]
    models = httpx.get(gateway.url + "/v1/models", headers=auth(BOB)).json()["data"]
    assert [m["id"] for m in models] == ["tiny"]  # a key sees the models it may use
    assert httpx.get(gateway.url + "/v1/models/org/other", headers=auth(BOB)).status_code == 404
    totals = gateway.access.totals()
    assert totals[("-", "-")].requests == {401: 2}
    assert totals[("bob", "gpt-4o-mini")].requests == {404: 1}
    assert totals[("bob", "tiny")].requests == {200: 2}
    assert totals[("bob", "-")].requests == {429: 1}  # refused before its body (and model) was read


def test_header_tricks(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn], tmp_path: Path
) -> None:
    """Lowercase `bearer` works; two Authorization headers, another scheme, or a key in another header do not."""
    gateway, _ = keyed_gateway(gateway_for, stand_ins, tmp_path)
    url = gateway.url + "/v1/chat/completions"
    assert httpx.post(url, json=CHAT, headers={"authorization": f"bearer {ALICE}"}).status_code == 200
    body = json.dumps(CHAT).encode()
    for headers in (
        f"Authorization: Bearer {ALICE}\r\nAuthorization: Bearer {ALICE}\r\n",
        f"Authorization: Bearer wrong\r\nAuthorization: Bearer {ALICE}\r\n",
        f"Authorization: Basic {ALICE}\r\n",
        f"X-Api-Key: {ALICE}\r\n",
        f"Authorization: Bearer {ALICE} {ALICE}\r\n",
    ):
        with socket.create_connection(gateway.server.address) as client:
            client.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + headers.encode()
                + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            assert client.recv(4096).split(b"\r\n")[0].endswith(b" 401 Unauthorized"), headers
    for raw in ("Bearer sk-älice-0123456789".encode(), b"Bearer \xff\xfe" + b"k" * 20, b"Bearer " + b"a" * 7000):
        with socket.create_connection(gateway.server.address) as client:
            client.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: "
                + raw
                + f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            status = client.recv(4096).split(b"\r\n")[0]
            assert status.endswith((b" 401 Unauthorized", b" 400 Bad Request")), (raw[:20], status)


def test_the_key_never_reaches_the_server_logs_or_metrics(
    gateway_for: Callable[..., RunningGateway],
    stand_ins: Callable[..., StandIn],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The server gets its own key (or none), the log and the counters carry the key's name only."""
    gateway, _ = keyed_gateway(gateway_for, stand_ins, tmp_path)
    for secret in (ALICE, BOB, "sk-wrong-0123456789"):
        httpx.post(gateway.url + "/v1/chat/completions", json={**CHAT, "model": "gpt-4o-mini"}, headers=auth(secret))
    gateway.access.save()
    saved = (tmp_path / "usage.json").read_text()
    for secret in (ALICE, BOB, "sk-wrong-0123456789"):
        assert secret not in caplog.text and secret not in saved
    assert "alice" in saved and "bob" in saved


def test_tokens_are_counted_from_usage_and_streams_through_the_openai_client(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn], tmp_path: Path
) -> None:
    """JSON usage, a stream's include_usage event and a stream without usage (estimated) add up per key."""
    gateway, _ = keyed_gateway(gateway_for, stand_ins, tmp_path, stand_in={"token_seconds": 0.01})
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=ALICE, max_retries=0, timeout=30)
    answer = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert answer.usage is not None
    counts = gateway.access.totals()[("alice", "tiny")]
    assert (counts.prompt_tokens, counts.completion_tokens) == (answer.usage.prompt_tokens, 4)
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = [chunk.usage for chunk in stream if chunk.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == 5
    # counted once the gateway's handler ends, just after the client read the usage event
    wait_until(lambda: gateway.access.totals()[("alice", "tiny")].requests == {200: 2}, 5, 0.02, what="2 counted")
    counts = gateway.access.totals()[("alice", "tiny")]
    assert counts.completion_tokens == 9 and counts.estimated_tokens == 0
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert all(c.choices and c.usage is None for c in chunks)  # the usage the gateway asked for is not passed on
    # counted once the gateway's handler ends, just after the client read [DONE]
    wait_until(lambda: gateway.access.totals()[("alice", "tiny")].requests == {200: 3}, 5, 0.02, what="3 counted")
    counts = gateway.access.totals()[("alice", "tiny")]
    assert counts.requests == {200: 3}
    assert counts.completion_tokens == 14 and counts.estimated_tokens == 0  # counted from the usage asked for
    assert counts.prompt_tokens == 3 * answer.usage.prompt_tokens
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-nobody-0123456789", max_retries=0).models.list()
    bob = openai.OpenAI(base_url=gateway.url + "/v1", api_key=BOB, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        bob.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])


def test_tokens_per_minute_refuses_once_spent(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn], tmp_path: Path
) -> None:
    """A key whose answers used its tokens_per_minute gets 429 until the bucket refills."""
    keys = write_keys(tmp_path / "keys", carol=f'key = "{CAROL}"\ntokens_per_minute = 10')
    server = stand_ins("tiny")
    gateway = gateway_for(deployments(), keys_dir=keys)
    gateway.supervisor.set("a", Availability.READY, server.port)
    url = gateway.url + "/v1/chat/completions"
    assert httpx.post(url, json={**CHAT, "max_tokens": 20}, headers=auth(CAROL)).status_code == 200
    refused = httpx.post(url, json=CHAT, headers=auth(CAROL))
    assert refused.status_code == 429 and "tokens_per_minute" in refused.json()["error"]["message"]


def test_a_reload_changes_the_keys_without_dropping_requests_in_flight(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn], tmp_path: Path
) -> None:
    """A reload reads the keys again: a removed key's stream in flight finishes, its next request is 401,
    an added key works; a key set that cannot be read refuses the reload and keeps the one before."""
    gateway, _ = keyed_gateway(gateway_for, stand_ins, tmp_path, stand_in={"token_seconds": 0.05})
    events: list[str] = []

    def stream() -> None:
        with httpx.stream(
            "POST",
            gateway.url + "/v1/chat/completions",
            json={**CHAT, "stream": True, "max_tokens": 30},
            headers=auth(ALICE),
            timeout=30,
        ) as reply:
            events.extend(line for line in reply.iter_lines() if line.startswith("data: "))

    thread = threading.Thread(target=stream)
    thread.start()
    wait_until(lambda: events, 10, what="the first streamed tokens (the stream in flight)")
    write_keys(tmp_path / "keys", carol=f'key = "{CAROL}"')
    gateway.reload_keys()
    url = gateway.url + "/v1/chat/completions"
    assert httpx.post(url, json=CHAT, headers=auth(ALICE)).status_code == 401
    assert httpx.post(url, json=CHAT, headers=auth(CAROL)).status_code == 200
    thread.join()
    assert events[-1] == "data: [DONE]" and len(events) > 20
    (tmp_path / "keys" / "carol.toml").chmod(0o644)
    with pytest.raises(ConfigError, match=r"carol\.toml"):
        gateway.reload_keys()
    assert httpx.post(url, json=CHAT, headers=auth(CAROL)).status_code == 200  # the keys before are kept


def test_admission_caps_requests_in_flight_and_serves_priority_first(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn], tmp_path: Path
) -> None:
    """At max_in_flight the gateway queues: the high-priority key's request is passed on before earlier ones;
    beyond queue_size: 503 with Retry-After."""
    keys = write_keys(tmp_path / "keys", alice=f'key = "{ALICE}"', bob=f'key = "{BOB}"\npriority = 10')
    server = stand_ins("tiny", token_seconds=0.1)
    gateway = gateway_for(deployments(), keys_dir=keys, max_in_flight=1, queue_size=3)
    gateway.supervisor.set("a", Availability.READY, server.port)
    finished: list[str] = []
    lock = threading.Lock()

    def ask(who: str, secret: str) -> None:
        reply = httpx.post(
            gateway.url + "/v1/chat/completions",
            json={**CHAT, "stream": True, "max_tokens": 5},
            headers=auth(secret),
            timeout=30,
        )
        with lock:
            finished.append(f"{who}:{reply.status_code}")

    threads = [threading.Thread(target=ask, args=(f"alice{i}", ALICE)) for i in range(3)]
    threads[0].start()
    wait_until(lambda: server.metric("vllm:num_requests_running") == 1, 10, what="alice0 in flight at the server")
    bob = threading.Thread(target=ask, args=("bob", BOB))
    for thread in [*threads[1:], bob]:
        thread.start()
    # the gateway's queue shows nowhere outside it: give the three their moment to join it (bob's
    # priority, not his arrival, puts him first)
    hold_for(QUEUE_JOIN_SECONDS, "three requests join the gateway's queue before the fourth finds it full")
    assert server.metric("vllm:num_requests_running") == 1  # one in flight, three wait at the gateway
    full = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=auth(ALICE), timeout=30)
    assert full.status_code == 503 and "Retry-After" in full.headers
    assert "in flight" in full.json()["error"]["message"]
    for thread in [*threads, bob]:
        thread.join()
    assert finished[:2] == ["alice0:200", "bob:200"]
    assert sorted(finished) == ["alice0:200", "alice1:200", "alice2:200", "bob:200"]


def test_usage_survives_a_restart_of_the_gateway(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn], tmp_path: Path
) -> None:
    """Counters are written at close and read by the next gateway on the same file."""
    gateway, _ = keyed_gateway(gateway_for, stand_ins, tmp_path)
    assert httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=auth(ALICE)).status_code == 200
    gateway.server.close()
    assert read_usage(tmp_path / "usage.json").totals[("alice", "tiny")].requests == {200: 1}
    again, _ = keyed_gateway(gateway_for, stand_ins, tmp_path)
    assert httpx.post(again.url + "/v1/chat/completions", json=CHAT, headers=auth(ALICE)).status_code == 200
    assert again.access.totals()[("alice", "tiny")].requests == {200: 2}
