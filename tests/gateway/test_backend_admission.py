"""The gateway and vLLM's own admission (issue 42): a backend 503 from a full engine queue is never passed raw.

A stand-in vLLM 0.34 with `--max-num-queued-reqs 1` whose slot a client holds directly (past the gateway): a
request through the gateway waits like a queued one and is answered once the slot frees, or gets the gateway's
own 503 with Retry-After when its queue time ends first. Any other 503 passes as it came."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import pytest

from dankserve.gateway.backend_admission import is_admission_refusal
from dankserve.gateway.backends import Availability
from tests.gateway.conftest import RunningGateway, StandIn

pytestmark = pytest.mark.slow

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
QUEUE_FULL = (
    b'{"error": {"message": "The engine is currently busy and cannot accept new requests. Please try again later '
    b'or on a different instance.", "type": "Service Unavailable", "param": null, "code": 503}}'
)


@contextmanager
def direct_stream(stand_in: StandIn, tokens: int) -> Iterator[None]:
    """A streamed completion straight to the server (not through the gateway), held open once it began."""
    body = {**CHAT, "stream": True, "max_tokens": tokens}
    url = f"http://127.0.0.1:{stand_in.port}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=30) as held:
        assert held.status_code == 200
        lines = held.iter_lines()  # kept: a dropped iterator would close the stream
        next(lines)  # the first event: admitted, its slot taken
        yield


def full_server(stand_ins: Callable[..., StandIn]) -> StandIn:
    return stand_ins("tiny", "--max-num-queued-reqs", "1", token_seconds=0.1, env={"FAKE_VLLM_VERSION": "0.34.0"})


def test_a_full_engine_queue_becomes_the_gateways_queued_wait(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn]
) -> None:
    """vLLM refuses while its one slot is taken; the gateway's request waits and is answered after it frees."""
    server = full_server(stand_ins)
    gateway = gateway_for({"a": {"model": "org/tiny", "served_model_name": "tiny"}}, queue_timeout_seconds=30)
    gateway.supervisor.set("a", Availability.READY, server.port)
    with direct_stream(server, tokens=15):  # holds the slot ~1.5 s
        assert httpx.post(f"http://127.0.0.1:{server.port}/v1/chat/completions", json=CHAT).status_code == 503
        reply = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=30)
    assert reply.status_code == 200, reply.text
    assert (
        server.metric('vllm:admission_rejections_total{engine="0",model_name="tiny",reason="max_num_queued_reqs"}') >= 2
    )


@pytest.mark.parametrize("stream", [False, True])
def test_a_queue_time_past_the_refusals_is_the_gateways_503_with_retry_after(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn], stream: bool
) -> None:
    """Still refused when its queue time ends: the gateway's own 503 (Retry-After), not vLLM's raw answer."""
    server = full_server(stand_ins)
    gateway = gateway_for(
        {"a": {"model": "org/tiny", "served_model_name": "tiny"}}, queue_timeout_seconds=0.5, retry_after_seconds=7
    )
    gateway.supervisor.set("a", Availability.READY, server.port)
    with direct_stream(server, tokens=40):  # holds the slot ~4 s
        reply = httpx.post(gateway.url + "/v1/chat/completions", json={**CHAT, "stream": stream}, timeout=30)
    if stream and reply.status_code == 200:  # a streamed wait that began: the error is its one event
        assert "vLLM's own admission" in reply.text
        return
    assert reply.status_code == 503
    assert reply.headers["Retry-After"] == "7"
    error = reply.json()["error"]
    assert error["type"] == "ServiceUnavailableError" and "vLLM's own admission" in error["message"]


@pytest.mark.parametrize(
    ("status", "body", "refusal"),
    [
        (503, QUEUE_FULL, True),
        (
            503,
            b'{"error": {"message": "The engine has reached its prefill token backlog limit. x", "code": 503}}',
            True,
        ),
        (503, b'{"error": {"message": "The engine is sleeping.", "code": 503}}', False),
        (500, QUEUE_FULL, False),
        (503, b"", False),
        (503, b"not json", False),
        (503, b"[]", False),
        (503, b'{"error": "cannot accept new requests"}', False),
        (503, QUEUE_FULL + b" " * 70000, False),
    ],
)
def test_which_503_is_vllms_admission(status: int, body: bytes, refusal: bool) -> None:
    assert is_admission_refusal(status, body) is refusal
