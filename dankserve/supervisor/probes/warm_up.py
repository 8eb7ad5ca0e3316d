"""The warm-up before READY over HTTP to the server: the served request shapes once (a short completion,
then the same streamed), so the first user request finds vLLM's kernels compiled.

On a real H200 the first completion after a cold boot was 8x the second: vLLM 0.26 compiles
Triton's `kernel_unified_attention` at the first request it runs (its log: "Triton kernel JIT
compilation during inference"). READY means the first user request is as fast as the second.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from dankserve.backend_address import BackendAddress
from dankserve.supervisor.probes.health import completion_error, post_completion

WARM_UP_PROMPT = "Hello"
WARM_UP_TOKENS = 4


@dataclass(frozen=True)
class WarmUpOutcome:
    """What the warm-up came to: `error` fails the boot; `unwarmed` says the API answered a 4xx, so it
    proved nothing wrong and warmed nothing (the first user request pays the compile: said, not failed)."""

    error: str | None = None
    unwarmed: str | None = None


def warm_up_server(address: BackendAddress, model: str, api_key: str | None, timeout: float) -> WarmUpOutcome:
    """Both warm-up requests within `timeout` seconds in all. A 4xx answer is no failure (the API answered
    without the engine: a pooling model has no completions API), as for the token probe, but it warmed
    nothing and is said as `unwarmed`; a 5xx, a malformed answer or no answer is an `error`."""
    deadline = time.monotonic() + timeout
    for stream in (False, True):
        outcome = _one(address, model, api_key, stream=stream, timeout=max(0.1, deadline - time.monotonic()))
        if outcome.error is not None or outcome.unwarmed is not None:
            what = "streamed completion" if stream else "completion"
            return WarmUpOutcome(
                f"{what}: {outcome.error}" if outcome.error else None,
                f"{what}: {outcome.unwarmed}" if outcome.unwarmed else None,
            )
    return WarmUpOutcome()


def _one(address: BackendAddress, model: str, api_key: str | None, *, stream: bool, timeout: float) -> WarmUpOutcome:
    request: dict[str, object] = {
        "model": model,
        "prompt": WARM_UP_PROMPT,
        "max_tokens": WARM_UP_TOKENS,
        "temperature": 0,
    }
    if stream:
        request["stream"] = True
    answer = post_completion(address, request, api_key, timeout, purpose="warm-up")
    if not isinstance(answer, str) and 400 <= answer[0] < 500:
        text = answer[1][:200].decode("utf-8", "replace")
        return WarmUpOutcome(unwarmed=f"HTTP {answer[0]} for model {model!r}: {text}")
    if not stream or isinstance(answer, str) or answer[0] != 200:
        return WarmUpOutcome(error=completion_error(answer))
    return WarmUpOutcome(error=_stream_error(answer[1]))


def _stream_error(payload: bytes) -> str | None:
    """Server-sent events ending in `data: [DONE]` (the whole stream is read: `payload` is all of it)."""
    events = [line[6:] for line in payload.decode("utf-8", "replace").splitlines() if line.startswith("data: ")]
    if not events or events[-1].strip() != "[DONE]":
        return f"the stream did not end in [DONE]: {payload[-200:].decode('utf-8', 'replace')!r}"
    return None
