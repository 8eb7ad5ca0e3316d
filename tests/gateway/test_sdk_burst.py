"""A burst of keyed streams from one address through the real `openai` SDK (issue 39 item 1).

An async client fans out from one address: every connection carries a valid key, so none may be
closed for the per-address cap (that cap is for connections proven keyless). The real gateway in
front of the stand-in; `max_retries=0`, so a dropped connection is an `APIConnectionError`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import openai
import pytest

from dankserve.gateway.backends import Availability
from tests.gateway.conftest import RunningGateway, StandIn
from tests.gateway.test_access import ALICE, deployments, write_keys
from tests.harness.daemon import free_port, process_deployment, running_daemon

pytestmark = pytest.mark.slow

STREAMS = 50


async def _burst(url: str, streams: int) -> list[str]:
    """Each stream's outcome: `ok`, `503 Retry-After N`, or the exception's name."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=ALICE, max_retries=0, timeout=60)

    async def one() -> str:
        try:
            chunks = await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True
            )
            text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
        except openai.APIStatusError as exc:
            return f"{exc.status_code} Retry-After {exc.response.headers.get('retry-after')}"
        except openai.APIError as exc:
            return type(exc).__name__
        return "ok" if text else "empty"

    try:
        return await asyncio.gather(*(one() for _ in range(streams)))
    finally:
        await client.close()


def test_fifty_keyed_streams_from_one_address_all_get_answers(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn], tmp_path: Path
) -> None:
    """50 concurrent streams of one key from 127.0.0.1: all 50 stream their answer (none dropped)."""
    keys = write_keys(tmp_path / "keys", alice=f'key = "{ALICE}"')
    server = stand_ins("tiny", token_seconds=0.02)
    gateway = gateway_for(deployments(), keys_dir=keys)
    gateway.supervisor.set("a", Availability.READY, server.port)
    outcomes = asyncio.run(_burst(gateway.url, STREAMS))
    assert outcomes == ["ok"] * STREAMS, {o: outcomes.count(o) for o in set(outcomes)}


def test_a_burst_past_the_queue_gets_503_with_retry_after_never_a_dropped_connection(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn], tmp_path: Path
) -> None:
    """With 4 in flight and 8 waiting at most, the other streams of the burst get the documented 503 with
    Retry-After: every stream has an HTTP answer."""
    keys = write_keys(tmp_path / "keys", alice=f'key = "{ALICE}"')
    server = stand_ins("tiny", token_seconds=0.05)
    gateway = gateway_for(deployments(), keys_dir=keys, max_in_flight=4, queue_size=8)
    gateway.supervisor.set("a", Availability.READY, server.port)
    outcomes = asyncio.run(_burst(gateway.url, STREAMS))
    counts = {o: outcomes.count(o) for o in set(outcomes)}
    assert set(counts) <= {"ok", "503 Retry-After 5"}, counts
    assert counts.get("ok", 0) >= 12, counts


def test_streams_beyond_max_connections_get_503_with_retry_after_not_a_dropped_connection(
    gateway_for: Callable[..., RunningGateway], stand_ins: Callable[..., StandIn], tmp_path: Path
) -> None:
    """12 streams at once into a gateway of 4 connections: 4 stream, the 8 beyond are answered 503 with
    Retry-After (and their connections closed) rather than closed unanswered."""
    keys = write_keys(tmp_path / "keys", alice=f'key = "{ALICE}"')
    server = stand_ins("tiny", token_seconds=0.1)
    gateway = gateway_for(deployments(), keys_dir=keys, max_connections=4)
    gateway.supervisor.set("a", Availability.READY, server.port)
    outcomes = asyncio.run(_burst(gateway.url, 12))
    counts = {o: outcomes.count(o) for o in set(outcomes)}
    assert set(counts) <= {"ok", "503 Retry-After 1"} and counts.get("ok", 0) >= 4, counts
    assert gateway.server.turned_away >= 1 and gateway.server.refused == 0


def test_a_real_daemons_gateway_answers_every_stream_of_a_burst(tmp_path: Path) -> None:
    """The same burst into the gateway of a real daemon serving the stand-in (process runtime): every stream
    gets its answer, none is dropped."""
    keys = write_keys(tmp_path / "keys", alice=f'key = "{ALICE}"')
    port = free_port()
    deployments = {"chat": process_deployment(free_port(), served_model_name="tiny")}
    gateway = {"gateway": {"listen": f"127.0.0.1:{port}", "keys_dir": str(keys)}}
    with running_daemon(tmp_path, deployments, extra_globals=gateway) as daemon:
        daemon.wait_for("chat", lambda d: d["phase"] == "ready")
        outcomes = asyncio.run(_burst(f"http://127.0.0.1:{port}", STREAMS))
    counts = {o: outcomes.count(o) for o in set(outcomes)}
    assert counts == {"ok": STREAMS}, counts
