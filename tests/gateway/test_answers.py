"""The gateway's answers as OpenAI clients and browsers read them (issue 39 items 4 and 14): a client that
leaves mid-stream counted 499, a failed stream ending in `data: [DONE]`, /v1/models in vLLM's ModelCard shape,
`X-Request-Id` on every answer and passed to vLLM, CORS preflights. Real gateways, stand-in vLLM servers and the
real `openai` client."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from dankserve.gateway.backends import Availability
from tests.gateway.conftest import RunningGateway, StandIn
from tests.gateway.test_proxy import long_stream
from tests.harness.wait import wait_until

pytestmark = pytest.mark.slow

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
KEY = "sk-alice-0123456789abcdef"


def one_model() -> dict[str, dict[str, Any]]:
    return {"a": {"model": "org/tiny-a", "served_model_name": "tiny"}}


def keyed(gateway_for: Callable[..., RunningGateway], tmp_path: Path, **settings: Any) -> RunningGateway:
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700, parents=True)
    (keys / "alice.toml").write_text(f'key = "{KEY}"\nmodels = ["*"]\n')
    (keys / "alice.toml").chmod(0o600)
    return gateway_for(one_model(), keys_dir=keys, **settings)


def test_a_client_that_leaves_mid_stream_is_counted_499_not_500(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn]
) -> None:
    """It had its 200 and the server did not fail: usage and /metrics count it under nginx's 499."""
    a = stand_ins("tiny", token_seconds=0.1)
    gateway = gateway_for(one_model())
    gateway.supervisor.set("a", Availability.READY, a.port)
    with long_stream(gateway):
        pass
    wait_until(lambda: gateway.access.totals().get(("-", "tiny")), 10, what="the request that was left counted")
    assert gateway.access.totals()[("-", "tiny")].requests == {499: 1}


def test_a_stream_that_ends_in_an_error_ends_with_done(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn]
) -> None:
    """A streamed request whose wait ran out, and one whose server answered an error after the loading
    comments began the stream: one error event, then `data: [DONE]` as vLLM ends a failed stream; the
    `openai` client raises the error with its message."""
    gateway = gateway_for(one_model(), queue_timeout_seconds=0.5)
    gateway.supervisor.set("a", Availability.PENDING)
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json={**CHAT, "stream": True}) as reply:
        lines = [line for line in reply.iter_lines() if line]
    assert lines[0].startswith(": dankserve: starting tiny")
    assert '"code": 503' in lines[-2] and lines[-1] == "data: [DONE]"
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.APIError, match="not ready within"):
        for _ in client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True
        ):
            pass

    other = stand_ins("not-tiny")  # serves another name: vLLM's 404 for `tiny`, inside the begun stream
    gateway = gateway_for(one_model(), queue_timeout_seconds=10)
    gateway.supervisor.set("a", Availability.PENDING, other.port)
    threading.Timer(0.5, gateway.supervisor.set, ("a", Availability.READY, other.port)).start()
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json={**CHAT, "stream": True}) as reply:
        lines = [line for line in reply.iter_lines() if line]
    assert lines[-2].startswith("data: {") and "does not exist" in lines[-2] and lines[-1] == "data: [DONE]"


def test_a_stream_whose_server_dies_mid_way_ends_with_an_error_event_and_done(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn]
) -> None:
    """The server killed after the stream's first events: the client reads the events it got, one error event
    naming the deployment, then `data: [DONE]`, as vLLM ends a stream that failed."""
    a = stand_ins("tiny", token_seconds=0.1)
    gateway = gateway_for(one_model())
    gateway.supervisor.set("a", Availability.READY, a.port)
    lines: list[str] = []
    body = {**CHAT, "stream": True, "max_tokens": 200}
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, timeout=30) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            lines.append(line)
            if len(lines) == 2:
                a.proc.kill()
    events = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert "broke off" in events[-2] and '"code": 502' in events[-2]
    assert len(events) < 200  # it did end early


def test_models_carry_vllms_model_card_fields(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn]
) -> None:
    """The gateway's /v1/models card has every field of the stand-in's (vLLM's ModelCard: owned_by, root,
    parent, max_model_len, permission), with vLLM's values where they are the same model's facts."""
    a = stand_ins("tiny", "--max-model-len", "2048")
    gateway = gateway_for(one_model())
    gateway.supervisor.set("a", Availability.READY, a.port, max_model_len=2048)
    vllm_card = httpx.get(f"http://127.0.0.1:{a.port}/v1/models").json()["data"][0]
    card = httpx.get(gateway.url + "/v1/models").json()["data"][0]
    assert set(vllm_card) <= set(card)
    for field in ("id", "object", "owned_by", "parent", "max_model_len"):
        assert card[field] == vllm_card[field], field
    assert set(card["permission"][0]) == set(vllm_card["permission"][0])
    listed = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused").models.list().data[0]
    assert listed.owned_by == "vllm" and listed.model_extra is not None and listed.model_extra["max_model_len"] == 2048


def test_every_answer_carries_an_x_request_id_passed_to_vllm(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn], tmp_path: Path
) -> None:
    """The client's X-Request-Id comes back on the answer and reaches vLLM (its completion id is
    `chatcmpl-ID`), streamed or not; without one (or with one unsafe to log) the gateway makes one;
    401s and 404s carry one too (the `openai` client's `request_id`)."""
    a = stand_ins("tiny")
    gateway = keyed(gateway_for, tmp_path)
    gateway.supervisor.set("a", Availability.READY, a.port)
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0)
    messages: Any = [{"role": "user", "content": "hi"}]
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=messages, max_tokens=2, extra_headers={"X-Request-Id": "trace-42"}
    )
    assert raw.headers["x-request-id"] == "trace-42"
    completion = raw.parse()
    assert completion.id == "chatcmpl-trace-42" and completion._request_id == "trace-42"
    stream = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=2, stream=True, extra_headers={"X-Request-Id": "trace-43"}
    )
    assert {chunk.id for chunk in stream} == {"chatcmpl-trace-43"}
    made = client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
    assert made._request_id is not None and len(made._request_id) == 32 and made.id == f"chatcmpl-{made._request_id}"
    for unsafe in ("a b", "x" * 200, 'trace"42'):
        reply = httpx.post(
            gateway.url + "/v1/chat/completions",
            json=CHAT,
            headers={"Authorization": f"Bearer {KEY}", "X-Request-Id": unsafe},
        )
        assert reply.status_code == 200 and reply.headers["x-request-id"] != unsafe
        assert reply.json()["id"] == f"chatcmpl-{reply.headers['x-request-id']}"
    with pytest.raises(openai.AuthenticationError) as refused:
        openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-nobody-0123456789", max_retries=0).models.list()
    assert refused.value.request_id
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="nothing", messages=messages, extra_headers={"X-Request-Id": "trace-44"})
    assert missing.value.request_id == "trace-44"
    assert httpx.get(gateway.url + "/health").headers["x-request-id"]


def test_cors_preflights_are_answered_per_allowed_origins_never_401(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn], tmp_path: Path
) -> None:
    """A browser's preflight carries no key: for an origin in allowed_origins it gets 204 with the method and
    headers allowed; for another, 403 naming the setting; the allowed origin's answers (a 401 too) carry
    Access-Control-Allow-Origin and expose X-Request-Id. Without allowed_origins every preflight is a 403."""
    a = stand_ins("tiny")
    gateway = keyed(gateway_for, tmp_path, allowed_origins=["https://chat.example.com"])
    gateway.supervisor.set("a", Availability.READY, a.port)
    url = gateway.url + "/v1/chat/completions"
    asked = {
        "Origin": "https://chat.example.com",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os",
    }
    preflight = httpx.options(url, headers=asked)
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == "https://chat.example.com"
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert preflight.headers["access-control-allow-headers"] == "authorization, content-type, x-stainless-os"
    evil = httpx.options(url, headers={**asked, "Origin": "https://evil.example"})
    assert evil.status_code == 403 and "allowed_origins" in evil.json()["error"]["message"]
    assert "access-control-allow-origin" not in evil.headers
    served = httpx.post(url, json=CHAT, headers={"Origin": asked["Origin"], "Authorization": f"Bearer {KEY}"})
    assert served.status_code == 200 and served.headers["access-control-allow-origin"] == asked["Origin"]
    assert "X-Request-Id" in served.headers["access-control-expose-headers"]
    unkeyed = httpx.post(url, json=CHAT, headers={"Origin": asked["Origin"]})
    assert unkeyed.status_code == 401 and unkeyed.headers["access-control-allow-origin"] == asked["Origin"]
    closed = keyed(gateway_for, tmp_path / "closed")
    assert httpx.options(closed.url + "/v1/chat/completions", headers=asked).status_code == 403
