"""The warm-up before READY over loopback HTTP: the served request shapes once (a short completion,
then the same streamed), so the first user request finds vLLM's kernels compiled.

On a real H200 the first completion after a cold boot was 8x the second: vLLM 0.26 compiles
Triton's `kernel_unified_attention` at the first request it runs (its log: "Triton kernel JIT
compilation during inference"). READY means the first user request is as fast as the second.
"""

from __future__ import annotations

import http.client
import json
import time

from dankserve.supervisor.health import probe_host_for

WARM_UP_PROMPT = "Hello"
WARM_UP_TOKENS = 4
MAX_ANSWER_BYTES = 1 << 20
"""The most of an answer read: a server's reply is outside input, and four tokens are a few hundred bytes."""


def warm_up_server(host: str, port: int, model: str, api_key: str | None, timeout: float) -> str | None:
    """Both warm-up requests within `timeout` seconds in all: None when they came back, else what went
    wrong. A 4xx answer is no failure (the API answered without the engine: a pooling model has no
    completions API), as for the token probe; a 5xx, a malformed answer or no answer is."""
    deadline = time.monotonic() + timeout
    for stream in (False, True):
        error = _one(host, port, model, api_key, stream=stream, timeout=max(0.1, deadline - time.monotonic()))
        if error is not None:
            return f"{'streamed ' if stream else ''}completion: {error}"
    return None


def _one(host: str, port: int, model: str, api_key: str | None, *, stream: bool, timeout: float) -> str | None:
    body = {"model": model, "prompt": WARM_UP_PROMPT, "max_tokens": WARM_UP_TOKENS, "temperature": 0}
    if stream:
        body["stream"] = True
    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    conn = http.client.HTTPConnection(probe_host_for(host), port, timeout=timeout)
    started = time.monotonic()
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body).encode(), headers=headers)
        response = conn.getresponse()
        payload = response.read(MAX_ANSWER_BYTES)
        if response.status >= 500:
            return f"HTTP {response.status}: {payload[:200].decode('utf-8', 'replace')}"
        if response.status != 200:
            return None
        return _stream_error(payload) if stream else _answer_error(payload)
    except TimeoutError:
        return f"no answer within {timeout:.1f} s"
    except (OSError, http.client.HTTPException) as exc:
        return f"{type(exc).__name__}: {exc} after {time.monotonic() - started:.1f} s"
    finally:
        conn.close()


def _answer_error(payload: bytes) -> str | None:
    try:
        choices = json.loads(payload).get("choices")
    except (ValueError, AttributeError):
        return f"not a completion: {payload[:200].decode('utf-8', 'replace')!r}"
    return None if choices else "the completion has no choices"


def _stream_error(payload: bytes) -> str | None:
    """Server-sent events ending in `data: [DONE]` (the whole stream is read: `payload` is all of it)."""
    events = [line[6:] for line in payload.decode("utf-8", "replace").splitlines() if line.startswith("data: ")]
    if not events or events[-1].strip() != "[DONE]":
        return f"the stream did not end in [DONE]: {payload[-200:].decode('utf-8', 'replace')!r}"
    return None
