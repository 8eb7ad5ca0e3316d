"""The warm-up before READY over loopback HTTP: the served request shapes once (a short completion,
then the same streamed), so the first user request finds vLLM's kernels compiled.

On a real H200 the first completion after a cold boot was 8x the second: vLLM 0.26 compiles
Triton's `kernel_unified_attention` at the first request it runs (its log: "Triton kernel JIT
compilation during inference"). READY means the first user request is as fast as the second.
"""

from __future__ import annotations

import time

from dankserve.supervisor.health import completion_error, post_completion

WARM_UP_PROMPT = "Hello"
WARM_UP_TOKENS = 4


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
    request: dict[str, object] = {
        "model": model,
        "prompt": WARM_UP_PROMPT,
        "max_tokens": WARM_UP_TOKENS,
        "temperature": 0,
    }
    if not stream:
        return completion_error(post_completion(host, port, request, api_key, timeout))
    answer = post_completion(host, port, {**request, "stream": True}, api_key, timeout)
    if isinstance(answer, str) or answer[0] != 200:
        return completion_error(answer)
    return _stream_error(answer[1])


def _stream_error(payload: bytes) -> str | None:
    """Server-sent events ending in `data: [DONE]` (the whole stream is read: `payload` is all of it)."""
    events = [line[6:] for line in payload.decode("utf-8", "replace").splitlines() if line.startswith("data: ")]
    if not events or events[-1].strip() != "[DONE]":
        return f"the stream did not end in [DONE]: {payload[-200:].decode('utf-8', 'replace')!r}"
    return None
