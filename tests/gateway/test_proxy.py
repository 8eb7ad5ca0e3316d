"""Tests for dankserve.gateway.proxy: real stand-in vLLM servers behind a real gateway."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from dankserve.gateway.backends import Availability
from tests.gateway.conftest import RunningGateway, StandIn
from tests.harness.wait import wait_until

pytestmark = pytest.mark.slow

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def two_models() -> dict[str, dict[str, Any]]:
    return {
        "a": {"model": "org/tiny-a", "served_model_name": "tiny", "aliases": ["small", "gpt-4o-mini"]},
        "b": {"model": "org/other"},
        "off": {"model": "org/disabled", "enabled": False},
    }


@contextmanager
def long_stream(gateway: RunningGateway) -> Iterator[socket.socket]:
    """A 200-token streamed chat through the gateway on a raw socket, once its first event arrived."""
    body = json.dumps({**CHAT, "stream": True, "max_tokens": 200}).encode()
    with socket.create_connection(gateway.server.address) as client:
        client.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        received = b""
        while b"data: " not in received:
            received += client.recv(65536)
        yield client


def test_models_lists_enabled_deployments_and_aliases(gateway_for: Callable[..., RunningGateway]) -> None:
    """/v1/models has every enabled deployment's served name and aliases, nothing of a disabled one."""
    gateway = gateway_for(two_models())
    reply = httpx.get(gateway.url + "/v1/models")
    assert reply.status_code == 200
    ids = [m["id"] for m in reply.json()["data"]]
    assert ids == ["tiny", "small", "gpt-4o-mini", "org/other"]
    assert reply.json()["data"][1]["root"] == "tiny"
    one = httpx.get(gateway.url + "/v1/models/gpt-4o-mini")
    assert one.status_code == 200 and one.json()["id"] == "gpt-4o-mini"
    assert httpx.get(gateway.url + "/v1/models/org/other").json()["id"] == "org/other"
    assert httpx.get(gateway.url + "/v1/models/org/disabled").status_code == 404


def test_request_is_routed_by_model_and_an_alias_is_rewritten(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn]
) -> None:
    """A chat request naming an alias reaches the right server under its served name."""
    a, b = stand_ins("tiny"), stand_ins("org/other")
    gateway = gateway_for(two_models())
    gateway.supervisor.set("a", Availability.READY, a.port)
    gateway.supervisor.set("b", Availability.READY, b.port)
    reply = httpx.post(gateway.url + "/v1/chat/completions", json={**CHAT, "model": "small"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == "tiny"
    reply = httpx.post(gateway.url + "/v1/completions", json={"model": "org/other", "prompt": "x", "max_tokens": 2})
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == "org/other"
    assert a.metric("vllm:request_success_total") == 1
    assert b.metric("vllm:request_success_total") == 1
    assert gateway.supervisor.touches == ["a", "b"]


def test_unknown_model_is_404_in_openai_shape(gateway_for: Callable[..., RunningGateway]) -> None:
    """A model no deployment answers to: 404 with OpenAI's error document."""
    gateway = gateway_for(two_models())
    reply = httpx.post(gateway.url + "/v1/chat/completions", json={**CHAT, "model": "nope"})
    assert reply.status_code == 404
    error = reply.json()["error"]
    assert error["type"] == "NotFoundError" and error["param"] == "model" and "nope" in error["message"]
    no_model = httpx.post(gateway.url + "/v1/chat/completions", json={"messages": []})
    assert no_model.status_code == 400 and no_model.json()["error"]["param"] == "model"
    not_json = httpx.post(gateway.url + "/v1/chat/completions", content=b"{nope")
    assert not_json.status_code == 400 and "JSON" in not_json.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/sleep", "/wake_up", "/is_sleeping", "/collective_rpc", "/reset_prefix_cache"])
def test_dev_mode_routes_are_never_passed_on(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn], path: str
) -> None:
    """vLLM's dev-mode routes get the gateway's 404, whatever the method and body."""
    a = stand_ins("tiny")
    gateway = gateway_for(two_models())
    gateway.supervisor.set("a", Availability.READY, a.port)
    for method in ("GET", "POST"):
        reply = httpx.request(method, gateway.url + path, json={"model": "tiny"})
        assert reply.status_code == 404
        assert "not served by the gateway" in reply.json()["error"]["message"]
    assert gateway.supervisor.touches == []


def test_streaming_passes_each_event_as_it_comes(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn]
) -> None:
    """SSE events reach the client one by one, spaced as the server wrote them (not gathered)."""
    a = stand_ins("tiny", token_seconds=0.2)
    gateway = gateway_for(two_models())
    gateway.supervisor.set("a", Availability.READY, a.port)
    arrivals: list[float] = []
    started = time.monotonic()
    with httpx.stream(
        "POST", gateway.url + "/v1/chat/completions", json={**CHAT, "stream": True, "max_tokens": 5}, timeout=30
    ) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        events = []
        for line in reply.iter_lines():
            if line.startswith("data: "):
                arrivals.append(time.monotonic() - started)
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert text == "The stand-in vLLM answers with"
    # Six events 0.2 s apart: the first came long before the last was written.
    assert arrivals[0] < 0.5
    assert arrivals[-1] > 1.0


def test_a_client_that_leaves_aborts_the_upstream_request(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn]
) -> None:
    """Closing the client connection mid-stream closes the server's connection: vLLM counts an abort."""
    a = stand_ins("tiny", token_seconds=0.1)
    gateway = gateway_for(two_models())
    gateway.supervisor.set("a", Availability.READY, a.port)
    with long_stream(gateway):
        assert a.metric("vllm:num_requests_running") == 1
    # 200 tokens would take 20 s; the abort shows within a few token intervals.
    aborted = 'vllm:request_success_total{engine="0",model_name="tiny",finished_reason="abort"}'
    wait_until(lambda: a.metric(aborted) >= 1, 5, 0.1, what="the server to see the client leave")
    assert a.metric("vllm:num_requests_running") == 0


def test_a_request_waits_while_the_deployment_boots(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn]
) -> None:
    """A request for a booting deployment waits in the queue, asks for a wake, and is served once ready."""
    a = stand_ins("tiny")
    gateway = gateway_for(two_models())
    gateway.supervisor.set("a", Availability.PENDING, a.port)
    threading.Timer(0.5, gateway.supervisor.set, ("a", Availability.READY, a.port)).start()
    started = time.monotonic()
    reply = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=10)
    assert reply.status_code == 200
    assert time.monotonic() - started >= 0.5
    assert gateway.supervisor.wakes == ["a"]


def test_asleep_deployment_is_woken(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn]
) -> None:
    """A request for an asleep deployment calls wake and is served when the supervisor reports it ready."""
    a = stand_ins("tiny")
    gateway = gateway_for(two_models())
    gateway.supervisor.set("a", Availability.ASLEEP, a.port)
    threading.Timer(0.3, gateway.supervisor.set, ("a", Availability.READY, a.port)).start()
    assert httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=10).status_code == 200
    assert gateway.supervisor.wakes == ["a"]


def test_full_queue_timeout_and_failed_wake_get_503_with_retry_after(
    gateway_for: Callable[..., RunningGateway],
) -> None:
    """Beyond queue_size waiters, after queue_timeout, or when the wake fails: 503 and Retry-After."""
    gateway = gateway_for(two_models(), queue_size=2, queue_timeout_seconds=1.5, retry_after_seconds=7)
    gateway.supervisor.set("a", Availability.PENDING)
    results: list[httpx.Response] = []

    def waiter() -> None:
        results.append(httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=10))

    waiters = [threading.Thread(target=waiter) for _ in range(2)]
    for thread in waiters:
        thread.start()
    # the gateway asks for a wake as each waiter joins its queue
    wait_until(lambda: len(gateway.supervisor.wakes) == 2, 10, what="two requests waiting (two wakes asked)")
    full = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=10)
    assert full.status_code == 503 and full.headers["Retry-After"] == "7"
    assert "2 requests already wait" in full.json()["error"]["message"]
    for thread in waiters:
        thread.join()
    assert [r.status_code for r in results] == [503, 503]
    assert all("not ready within 1.5s" in r.json()["error"]["message"] for r in results)

    threading.Timer(0.3, gateway.supervisor.set, ("a", Availability.OFF)).start()
    failed = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=10)
    assert failed.status_code == 503 and failed.headers["Retry-After"] == "7"
    assert "did not become ready" in failed.json()["error"]["message"]
    off = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=10)
    assert off.status_code == 503 and "not running" in off.json()["error"]["message"]


def test_keys_client_side_and_server_side(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn], tmp_path: Any
) -> None:
    """With api_key_file the gateway wants the key; it sends each server its own key, never the client's."""
    key_file = tmp_path / "gateway.key"
    key_file.write_text("client-key-0123456789\n")
    key_file.chmod(0o600)
    a = stand_ins("tiny", "--api-key", "server-key-abcdef")
    gateway = gateway_for(two_models(), api_key_file=key_file)
    gateway.supervisor.set("a", Availability.READY, a.port, api_key="server-key-abcdef")
    assert httpx.get(gateway.url + "/v1/models").status_code == 401
    wrong = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer x"})
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "AuthenticationError"
    auth = {"Authorization": "Bearer client-key-0123456789"}
    assert httpx.get(gateway.url + "/v1/models", headers=auth).status_code == 200
    assert httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=auth).status_code == 200
    assert httpx.get(gateway.url + "/health").status_code == 200


def test_an_unanswering_server_is_a_502(gateway_for: Callable[..., RunningGateway]) -> None:
    """A ready deployment whose port refuses connections: 502 in OpenAI's shape, the gateway goes on."""
    gateway = gateway_for(two_models())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gateway.supervisor.set("a", Availability.READY, port)
    reply = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT)
    assert reply.status_code == 502 and "did not answer" in reply.json()["error"]["message"]
    assert httpx.get(gateway.url + "/v1/models").status_code == 200


def test_body_limits(gateway_for: Callable[..., RunningGateway], caplog: pytest.LogCaptureFixture) -> None:
    """A body over max_request_bytes is 413 (declared or chunked); a bad Content-Length a 400, no traceback."""
    gateway = gateway_for(two_models(), max_request_bytes=4096)
    big = httpx.post(gateway.url + "/v1/chat/completions", content=b"x" * 10_000)
    assert big.status_code == 413

    def chunks() -> Any:
        for _ in range(10):
            yield b"y" * 1000

    chunked = httpx.post(gateway.url + "/v1/chat/completions", content=chunks())
    assert chunked.status_code == 413
    for length in (b"-1", b"abc"):
        with socket.create_connection(gateway.server.address) as client:
            client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n")
            assert client.recv(4096).split(b"\r\n")[0].endswith(b" 400 Bad Request")
    assert "Traceback" not in caplog.text
    assert all(record.exc_info is None for record in caplog.records)


def test_a_deeply_nested_body_is_a_400(gateway_for: Callable[..., RunningGateway]) -> None:
    """A JSON body nested 100,000 deep (under max_request_bytes) is the client's error, 400, not a 500."""
    gateway = gateway_for(two_models())
    for body in (b"[" * 100_000 + b"]" * 100_000, b'{"model": "small", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"):
        reply = httpx.post(gateway.url + "/v1/chat/completions", content=body, timeout=30)
        assert reply.status_code == 400, reply.text
        assert "nests" in reply.json()["error"]["message"]


def test_closing_the_gateway_ends_open_streams_promptly(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn]
) -> None:
    """The daemon stopping closes the gateway within seconds even with a 20 s stream open; the server sees an abort."""
    a = stand_ins("tiny", token_seconds=0.1)
    gateway = gateway_for(two_models())
    gateway.supervisor.set("a", Availability.READY, a.port)
    with long_stream(gateway):
        started = time.monotonic()
        gateway.server.close()
        assert time.monotonic() - started < 5
    wait_until(lambda: a.metric("vllm:num_requests_running") == 0, 5, 0.1, what="the server's request to end")
