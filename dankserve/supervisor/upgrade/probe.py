"""The upgrade's fixed request: the same greedy completion sent to the old and the new server.

A plain request for the greedy token ids (vLLM's `return_token_ids`, 0.10.2+), then a streamed one
untimed (WARM_RUNS: the trial server has just booted and served nothing, while the old one is warm from
its users), then the best of DECODE_RUNS, timed from its first token to its last for decode tokens per
second (the first token's wait is prefill and queueing, not decode). Answers are bounded and read as
hostile JSON."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable

from dankserve.backend_address import BackendAddress, http_connection
from dankserve.supervisor.upgrade.judging import Measurement

PROMPT = "The quick brown fox jumps over the lazy dog. Then the fox"
DECODE_TOKENS = 64
WARM_RUNS = 1
"""Streamed requests sent first and not timed. On the H200 a trial of the same vLLM build timed 18.6 %
slower than the old server in the best of three runs right after its boot, and was rolled back."""
DECODE_RUNS = 5
"""The streamed request is sent this many times and the fastest run counts: noise (a busy host, a
scheduler hiccup) only ever slows a run, so the best of a few is the server's own speed."""
MAX_ANSWER_BYTES = 1 << 20
MAX_IDS = 4096


class ProbeFailed(Exception):
    """The server did not answer the fixed request (the message says how)."""


def _body(model: str, stream: bool) -> bytes:
    request = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": DECODE_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
        "return_token_ids": True,
    }
    return json.dumps(request).encode()


def _post(address: BackendAddress, body: bytes, api_key: str | None, timeout: float) -> http.client.HTTPResponse:
    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    conn = http_connection(address, timeout)
    try:
        conn.request("POST", "/v1/completions", body=body, headers=headers)
        response = conn.getresponse()
    except (OSError, http.client.HTTPException) as exc:
        conn.close()
        raise ProbeFailed(f"{type(exc).__name__}: {exc}") from None
    if response.status != 200:
        payload = response.read(500).decode("utf-8", "replace")
        conn.close()
        raise ProbeFailed(f"HTTP {response.status}: {payload}")
    return response


def greedy_ids(address: BackendAddress, model: str, api_key: str | None, timeout: float) -> tuple[int, ...]:
    """The completion's token ids (empty when the server does not return them)."""
    response = _post(address, _body(model, False), api_key, timeout)
    try:
        payload = response.read(MAX_ANSWER_BYTES)
        answer = json.loads(payload)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise ProbeFailed(f"unreadable answer: {exc}") from None
    finally:
        response.close()
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ProbeFailed("the completion has no choices")
    ids = choices[0].get("token_ids")
    if not isinstance(ids, list):
        return ()
    return tuple(i for i in ids[:MAX_IDS] if isinstance(i, int) and not isinstance(i, bool))


def decode_rate(
    address: BackendAddress,
    model: str,
    api_key: str | None,
    timeout: float,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> float | None:
    """Tokens per second between the streamed completion's first and last token (None: too few to time)."""
    response = _post(address, _body(model, True), api_key, timeout)
    stamps: list[float] = []
    read = 0
    try:
        while True:
            line = response.readline(65536)
            read += len(line)
            if not line or read > MAX_ANSWER_BYTES:
                break
            text = line.strip()
            if text == b"data: [DONE]":
                break
            if text.startswith(b"data:"):
                stamps.append(clock())
    except (OSError, http.client.HTTPException) as exc:
        raise ProbeFailed(f"the stream broke: {exc}") from None
    finally:
        response.close()
    if len(stamps) < 3 or stamps[-1] <= stamps[0]:
        return None
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def measure(
    address: BackendAddress, model: str, api_key: str | None, *, kv_cache_tokens: int | None, timeout: float = 60.0
) -> Measurement:
    """One server's figures; ProbeFailed when it does not answer."""
    ids = greedy_ids(address, model, api_key, timeout)
    for _ in range(WARM_RUNS):
        decode_rate(address, model, api_key, timeout)
    rates = [r for _ in range(DECODE_RUNS) if (r := decode_rate(address, model, api_key, timeout)) is not None]
    rate = max(rates) if rates else None
    return Measurement(kv_cache_tokens, None if rate is None else round(rate, 2), ids)
