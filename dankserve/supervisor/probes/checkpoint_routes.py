"""vLLM 0.34's checkpoint routes over HTTP (issue 41): what a snapshot's capture runs in place of a level-2 sleep.

Read from vLLM 0.34.0 (`vllm/entrypoints/serve/checkpoint/api_router.py`, `vllm/v1/engine/core.py`), served with
`--enable-sleep-mode` and no dev mode:

- `POST /checkpoint/prepare[?mode=wait]`: drains the engine (with `wait`, requests in flight finish; new ones
  queue), then releases its KV cache and communicator state (NCCL), the weights staying on the GPU. It answers
  once started, `{"state": "preparing"|"prepared"}` (repeating is a no-op); 400 with `{"state", "error"}` when
  it cannot (an engine asleep, a failed or restoring one).
- `GET /checkpoint/status`: 200 once `prepared` (safe to capture), 503 before, 500 after a failure (`error`).
- `POST /checkpoint/restore`: brings back what preparing released, wakes the KV cache and serves again:
  `{"state": "running"}`; repeated when done, 200; 400 while preparing or failed.

A prepared engine refuses `/sleep` and `/wake_up`: the capture's undo and a restore use `restore` here.
Every answer is read as hostile input (bounded, JSON or nothing). Each function answers a problem (a
sentence) or None: the callers turn it into their step's failure.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import httpx

from dankserve.backend_address import BackendAddress, httpx_client

PREPARE_TIMEOUT_SECONDS = 300.0
"""The longest a prepare's drain may take (the gateway holds new requests meanwhile: only those in flight)."""
_POLL_SECONDS = (0.02, 0.5)
"""The status poll's first and longest interval (doubling)."""
_MAX_ANSWER_BYTES = 4096


def _answer(response: httpx.Response) -> tuple[str | None, str | None]:
    """(state, error) of a CheckpointStateResponse; (None, None) for anything else."""
    body = response.content
    if not body or len(body) > _MAX_ANSWER_BYTES:
        return None, None
    try:
        document = json.loads(body)
    except ValueError:
        return None, None
    if not isinstance(document, dict):
        return None, None
    state, error = document.get("state"), document.get("error")
    return (str(state)[:40] if isinstance(state, str) else None), (str(error)[:300] if isinstance(error, str) else None)


def _said(route: str, response: httpx.Response) -> str:
    state, error = _answer(response)
    what = f"state {state!r}" if state is not None else response.text[:200]
    return f"{route} answered HTTP {response.status_code} ({what}{f': {error}' if error else ''})"


def prepare(
    address: BackendAddress,
    api_key: str | None,
    *,
    timeout: float = PREPARE_TIMEOUT_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
) -> str | None:
    """Prepare the server for a checkpoint and wait until it is `prepared` (None), or say why not."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    end = clock() + timeout
    try:
        with httpx_client(address, headers, 30.0) as client:
            started = client.post("/checkpoint/prepare", params={"mode": "wait"})
            if started.status_code != 200:
                return _said("POST /checkpoint/prepare", started)
            interval = _POLL_SECONDS[0]
            while True:
                status = client.get("/checkpoint/status")
                state, _error = _answer(status)
                if status.status_code == 200 and state == "prepared":
                    return None
                if status.status_code != 503 or state not in ("preparing", "running"):
                    return _said("GET /checkpoint/status", status)
                if clock() >= end:
                    return f"the server was not prepared for the checkpoint in {timeout:g} s (state {state!r})"
                pause(interval)
                interval = min(interval * 2, _POLL_SECONDS[1])
    except httpx.HTTPError as exc:
        return f"the checkpoint prepare failed: {type(exc).__name__}: {exc}"


def restore(address: BackendAddress, api_key: str | None, *, timeout: float = PREPARE_TIMEOUT_SECONDS) -> str | None:
    """Serve again after a checkpoint (None), or say why not; a server already running answers 200 too."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx_client(address, headers, timeout) as client:
            answer = client.post("/checkpoint/restore")
    except httpx.HTTPError as exc:
        return f"the checkpoint restore failed: {type(exc).__name__}: {exc}"
    state, _error = _answer(answer)
    if answer.status_code != 200 or state not in ("running", "restoring"):
        return _said("POST /checkpoint/restore", answer)
    return None


def prepared(address: BackendAddress, api_key: str | None, timeout: float = 5.0) -> bool:
    """The server is prepared or preparing (a capture a killed daemon left midway): it needs `restore`."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx_client(address, headers, timeout) as client:
            state, _error = _answer(client.get("/checkpoint/status"))
    except httpx.HTTPError:
        return False
    return state in ("preparing", "prepared")
