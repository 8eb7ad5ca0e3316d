"""What a client sees while its model wakes or boots (issue 29): SSE loading comments the real `openai`
client ignores, Retry-After from the prediction, /v1/models' state and ready seconds, the swap bound's
refusal. A real gateway in front of the stand-in, the supervisor's answers set by the test."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from dankserve.gateway import proxy
from dankserve.gateway.backends import Availability
from tests.gateway.conftest import RunningGateway, StandIn
from tests.gateway.test_proxy import CHAT, two_models

pytestmark = pytest.mark.slow


def _client(gateway: RunningGateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_a_streamed_request_that_waits_gets_loading_comments_that_the_openai_client_ignores(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While `a` wakes, the stream opens with `: dankserve: waking tiny, about 0.9 s`, repeated while it waits;
    then the server's events follow; the openai client streams the same text as without a wait."""
    monkeypatch.setattr(proxy, "LOADING_COMMENT_SECONDS", 0.2)
    a = stand_ins("tiny")
    gateway = gateway_for(two_models())
    gateway.supervisor.set("a", Availability.READY, a.port)
    client = _client(gateway)
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]

    def streamed() -> str:
        chunks = client.chat.completions.create(model="tiny", messages=messages, max_tokens=4, stream=True)
        return "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)

    expected = streamed()
    assert expected

    gateway.supervisor.set("a", Availability.PENDING, a.port, state="waking", ready_in=0.9)
    threading.Timer(1.0, gateway.supervisor.set, ("a", Availability.READY, a.port)).start()
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json={**CHAT, "stream": True}, timeout=30) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in reply.iter_lines() if line]
    comments = [line for line in lines if line.startswith(":")]
    assert comments[0] == ": dankserve: waking tiny, about 0.9 s"
    assert len(comments) >= 3, "repeated while it waits"
    assert lines[: len(comments)] == comments and lines[-1] == "data: [DONE]"

    gateway.supervisor.set("a", Availability.ASLEEP, a.port, state="asleep", ready_in=0.5)
    threading.Timer(0.7, gateway.supervisor.set, ("a", Availability.READY, a.port)).start()
    assert streamed() == expected


def test_a_stream_whose_wait_fails_ends_in_an_error_the_openai_client_raises(
    gateway_for: Callable[..., RunningGateway],
) -> None:
    """Once loading comments began the status is sent: a failed wake is an SSE error event (openai.APIError)."""
    gateway = gateway_for(two_models())
    gateway.supervisor.set("a", Availability.PENDING, state="starting", ready_in=None)
    threading.Timer(0.5, gateway.supervisor.set, ("a", Availability.OFF)).start()
    with pytest.raises(openai.APIError, match="did not become ready"):
        for _ in _client(gateway).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True
        ):
            pass


def test_retry_after_is_the_predicted_wait(gateway_for: Callable[..., RunningGateway]) -> None:
    """A full queue's 503 carries the predicted ready seconds rounded up; a timed-out wait the prediction left;
    without a prediction, retry_after_seconds."""
    gateway = gateway_for(two_models(), queue_size=0, retry_after_seconds=7)
    gateway.supervisor.set("a", Availability.PENDING, state="starting", ready_in=12.3)
    full = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=10)
    assert full.status_code == 503 and full.headers["Retry-After"] == "13"
    gateway.supervisor.set("a", Availability.PENDING, state="starting")
    assert httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=10).headers["Retry-After"] == "7"

    waiting = gateway_for(two_models(), queue_timeout_seconds=0.5, retry_after_seconds=7)
    waiting.supervisor.set("a", Availability.PENDING, state="waking", ready_in=2.2)
    late = httpx.post(waiting.url + "/v1/chat/completions", json=CHAT, timeout=10)
    assert late.status_code == 503 and late.headers["Retry-After"] == "3"


def test_a_wake_held_by_the_swap_bound_past_the_queue_timeout_is_refused_at_once(
    gateway_for: Callable[..., RunningGateway],
) -> None:
    """Held 50 s by max_swaps_per_minute with 5 s to wait: 503 at once, Retry-After the held wait plus the wake."""
    gateway = gateway_for(two_models(), queue_timeout_seconds=5)
    gateway.supervisor.set("a", Availability.ASLEEP, state="asleep", ready_in=50.9, held_for=50.0)
    started = time.monotonic()
    reply = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=10)
    assert time.monotonic() - started < 3
    assert reply.status_code == 503 and reply.headers["Retry-After"] == "51"
    assert "max_swaps_per_minute" in reply.json()["error"]["message"]


def test_a_request_for_a_draining_member_waits_and_wakes_it_once_it_fell_asleep(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn]
) -> None:
    """A member finishing its requests before a swap holds new ones; once it is asleep they ask for its wake
    again (their first ask came while it was awake) and are served when it is ready."""
    a = stand_ins("tiny")
    gateway = gateway_for(two_models())
    gateway.supervisor.set("a", Availability.PENDING, a.port, state="draining")
    threading.Timer(0.3, gateway.supervisor.set, ("a", Availability.ASLEEP, a.port)).start()
    threading.Timer(0.6, gateway.supervisor.set, ("a", Availability.READY, a.port)).start()
    assert httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=10).status_code == 200
    assert gateway.supervisor.wakes == ["a", "a"]


def test_models_carry_each_deployments_state_and_ready_seconds(gateway_for: Callable[..., RunningGateway]) -> None:
    """Extra fields per entry: the state and predicted ready seconds (0 when ready); the openai client keeps them."""
    gateway = gateway_for(two_models())
    gateway.supervisor.set("a", Availability.READY, state="ready")
    gateway.supervisor.set("b", Availability.ASLEEP, state="asleep", ready_in=0.9)
    listed = {m["id"]: m for m in httpx.get(gateway.url + "/v1/models", timeout=5).json()["data"]}
    assert (listed["tiny"]["state"], listed["tiny"]["ready_seconds"]) == ("ready", 0.0)
    assert (listed["small"]["state"], listed["org/other"]["state"]) == ("ready", "asleep")
    assert listed["org/other"]["ready_seconds"] == 0.9
    models = {m.id: m for m in _client(gateway).models.list()}
    assert (models["org/other"].model_extra or {})["ready_seconds"] == 0.9
