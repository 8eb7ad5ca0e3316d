"""vLLM's own admission seen from the gateway (pure): which 503 answers are a full engine queue.

From 0.29, `--max-num-queued-reqs` / `--max-num-queued-tokens` make vLLM refuse a request beyond the limit
with 503 and OpenAI's error shape, typed by the HTTP phrase (vllm/exceptions.py QueueOverflowError and
MaxQueuedTokensError, vllm/entrypoints/serve/exception_handling/error_response.py). The plan sets the
limit from the gateway's queue, so the gateway's own requests fit; a refusal that still comes (clients
reaching the server directly filled it) is the gateway's to handle: the request waits and tries again
within its queue time, or gets the gateway's 503 with Retry-After, never vLLM's raw answer.
"""

from __future__ import annotations

import json

MAX_REFUSAL_BYTES = 1 << 16
"""An error document is a few hundred bytes: a 503 body is read this far at most."""
BACKEND_FULL_PAUSE_SECONDS = 0.1
"""How long a refused request waits before it asks again (a slot frees when any request ends)."""

REFUSAL_MESSAGES = (
    "cannot accept new requests",  # QueueOverflowError: --max-num-queued-reqs
    "prefill token backlog limit",  # MaxQueuedTokensError: --max-num-queued-tokens
)


class BackendFull(Exception):
    """vLLM's admission refused the request (its engine queue is full)."""


def is_admission_refusal(status: int, body: bytes) -> bool:
    """A 503 whose OpenAI error document is vLLM's queue-limit refusal (anything else is passed on as is)."""
    if status != 503 or not body or len(body) > MAX_REFUSAL_BYTES:
        return False
    try:
        document = json.loads(body)
    except ValueError:
        return False
    error = document.get("error") if isinstance(document, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return isinstance(message, str) and any(text in message for text in REFUSAL_MESSAGES)
