"""Security: a key holder cannot slip past its limits or take the gateway's connections (issue 38, items
2, 3 and 7). The real gateway in front of the stand-in vLLM; each test plays the key holder.

- `tokens_per_minute` was bypassed three ways: a stream without `include_usage` counted no prompt
  tokens; an answer over 4 MiB counted none; parallel requests were all let in while the bucket was
  above zero.
- A key limited to `max_concurrent = 1, requests_per_minute = 1` held every connection with slow
  bodies: its connections counted as authenticated before any limit was checked.
- Priority did nothing once a deployment's queue was full.
"""

from __future__ import annotations

import concurrent.futures
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from dankserve.backend_address import TcpAddress
from dankserve.gateway.backends import Availability
from tests.gateway import conftest as gateway_fixtures
from tests.gateway.conftest import RunningGateway, StandIn
from tests.gateway.test_access import ALICE, auth, deployments, write_keys
from tests.harness.wait import wait_until

pytestmark = pytest.mark.slow

MALLORY = "sk-mallory-0123456789abcdef"
gateway_for = gateway_fixtures.gateway_for
stand_ins = gateway_fixtures.stand_ins


def gateway_with(
    gateway_for: Callable[..., RunningGateway],
    stand_ins: Callable[..., StandIn],
    tmp_path: Path,
    mallory: str,
    **settings: object,
) -> RunningGateway:
    """alice without limits, mallory with the limits given (TOML lines)."""
    keys = write_keys(tmp_path / "keys", alice=f'key = "{ALICE}"', mallory=f'key = "{MALLORY}"\n{mallory}')
    server = stand_ins("tiny", **settings.pop("stand_in", {}))  # type: ignore[arg-type]
    gateway = gateway_for(deployments(), keys_dir=keys, **settings)
    gateway.supervisor.set("a", Availability.READY, server.port)
    return gateway


def chat(secret: str, **more: object) -> tuple[dict[str, str], dict[str, object]]:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **more}
    return auth(secret), body


def test_a_stream_without_include_usage_is_charged_its_prompt(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn], tmp_path: Path
) -> None:
    """A 1,900-token prompt streamed without `include_usage` against 500 tokens a minute: the gateway asks the
    server for the usage, charges the prompt, and the next request is refused. The client sees no usage event."""
    gateway = gateway_with(gateway_for, stand_ins, tmp_path, "tokens_per_minute = 500")
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=MALLORY, max_retries=0, timeout=30)
    prompt = "word " * 1500
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": prompt}], max_tokens=2, stream=True
        )
    )
    assert chunks and all(c.usage is None for c in chunks)
    counted = wait_until(lambda: gateway.access.totals().get(("mallory", "tiny")), 5, 0.02, what="mallory counted")
    assert counted.prompt_tokens > 1500 and counted.estimated_tokens == 0
    with pytest.raises(openai.RateLimitError, match="tokens_per_minute"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)


def test_an_answer_over_4_mib_is_counted(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn], tmp_path: Path
) -> None:
    """A completion of a million tokens (about 5 MiB of JSON) is counted, and the key is over its limit after."""
    gateway = gateway_with(gateway_for, stand_ins, tmp_path, "tokens_per_minute = 100000")
    url = gateway.url + "/v1/completions"
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 1_000_000}
    reply = httpx.post(url, json=body, headers=auth(MALLORY), timeout=120)
    assert reply.status_code == 200 and len(reply.content) > 4 * 1024 * 1024
    counted = gateway.access.totals()[("mallory", "tiny")]
    assert counted.completion_tokens == 1_000_000
    again = httpx.post(url, json={**body, "max_tokens": 1}, headers=auth(MALLORY), timeout=30)
    assert again.status_code == 429 and "tokens_per_minute" in again.json()["error"]["message"]


def test_a_parallel_burst_is_charged_as_it_comes_in(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn], tmp_path: Path
) -> None:
    """20 requests of 100 tokens each at once against 1,000 tokens a minute: those let in used at most the
    minute's allowance; the rest got 429 (before: all 20 were let in while the bucket was above zero)."""
    gateway = gateway_with(
        gateway_for, stand_ins, tmp_path, "tokens_per_minute = 1000", stand_in={"token_seconds": 0.02}
    )
    headers, body = chat(MALLORY, max_tokens=100)
    barrier = threading.Barrier(20)

    def one() -> int:
        barrier.wait()
        return httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=60).status_code

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        codes = list(pool.map(lambda _: one(), range(20)))
    assert set(codes) == {200, 429} and codes.count(429) >= 10, codes
    counted = gateway.access.totals()[("mallory", "tiny")]
    assert counted.prompt_tokens + counted.completion_tokens <= 1000, counted


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    yield held
    for sock in held:
        sock.close()


def test_a_limited_key_cannot_take_every_connection(
    gateway_for: Callable[..., RunningGateway],
    stand_ins: Callable[..., StandIn],
    tmp_path: Path,
    sockets: list[socket.socket],
) -> None:
    """mallory (max_concurrent 1, requests_per_minute 1) opens all 10 of the gateway's connections, each with
    its key and half a body; alice's 8 requests meanwhile are all answered."""
    gateway = gateway_with(
        gateway_for,
        stand_ins,
        tmp_path,
        "max_concurrent = 1\nrequests_per_minute = 1",
        max_connections=10,
        body_timeout_seconds=60,
    )
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {MALLORY}\r\nContent-Length: 1000\r\n\r\n"
    ).encode()
    for _ in range(10):
        sock = socket.create_connection(gateway.server.address, timeout=5)
        sock.sendall(head + b'{"model": "tiny", ')
        sockets.append(sock)
    wait_until(lambda: sum(_peeked_status(s) == b"429" for s in sockets) == 9, 10, what="nine of mallory's ten refused")
    headers, body = chat(ALICE)
    answered: list[int | str] = []
    for _ in range(8):
        try:
            reply = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=5)
            answered.append(reply.status_code)
        except httpx.HTTPError as exc:
            answered.append(type(exc).__name__)
    assert answered == [200] * 8
    refused = [s for s in sockets if _status(s) == b"429"]
    assert len(refused) == 9, "all but one of mallory's requests refused before their bodies"


def _peeked_status(sock: socket.socket) -> bytes:
    """The status of an answer already there, left unread (b"" while none came)."""
    try:
        head = sock.recv(200, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:
        return b""
    parts = head.split(b" ")
    return parts[1] if len(parts) > 1 else b""


def _status(sock: socket.socket) -> bytes:
    sock.settimeout(0.5)
    try:
        head = sock.recv(200)
    except OSError:
        return b""
    parts = head.split(b" ")
    return parts[1] if len(parts) > 1 else b""


def test_a_higher_priority_takes_the_place_of_a_lower_one_in_a_full_queue(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn], tmp_path: Path
) -> None:
    """While the deployment boots, mallory (priority -1000) fills its queue of 4; alice (priority 0) still gets
    in, and mallory's last request gets the documented 503 with Retry-After (before: alice's was the 503)."""
    gateway = gateway_with(gateway_for, stand_ins, tmp_path, "priority = -1000", queue_size=4)
    address = gateway.supervisor.backend("a").address
    assert isinstance(address, TcpAddress)
    port = address.port
    gateway.supervisor.set("a", Availability.PENDING, port, state="starting", ready_in=30.0)
    url = gateway.url + "/v1/chat/completions"

    def post(secret: str) -> httpx.Response:
        headers, body = chat(secret)
        return httpx.post(url, json=body, headers=headers, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        low = []
        for queued in range(1, 5):
            low.append(pool.submit(post, MALLORY))
            # in this order in the line: the gateway asks for a wake as each joins it
            wait_until(lambda: len(gateway.supervisor.wakes) == queued, 10, what=f"{queued} in the queue")  # noqa: B023
        high = pool.submit(post, ALICE)
        last = low[-1].result(timeout=10)
        assert last.status_code == 503 and last.headers["Retry-After"] == "30"
        assert "higher key priority" in last.json()["error"]["message"]
        assert not high.done()
        gateway.supervisor.set("a", Availability.READY, port)
        assert high.result(timeout=30).status_code == 200
        assert [f.result(timeout=30).status_code for f in low[:3]] == [200, 200, 200]
