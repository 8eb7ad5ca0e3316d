"""The readiness and liveness probes over HTTP to the server's address (its private socket, or loopback
TCP): vLLM's /health, its /metrics, and a one-token completion."""

from __future__ import annotations

import http.client
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from dankserve.backend_address import BackendAddress, http_connection
from dankserve.errors import resources_exhausted


@dataclass(frozen=True)
class HealthResult:
    """One probe: the HTTP status, or None when nothing answered."""

    status: int | None
    error: str | None = None
    own_error: bool = False
    """The probe could not be sent for want of the daemon's own resources (EMFILE, ENOMEM): no verdict."""

    @property
    def healthy(self) -> bool:
        return self.status == 200


HEALTH_RETRY_SECONDS = 0.05
"""How often /health is asked once the log says the server is up, until it answers."""
MAX_IDLE_SECONDS = 1.0
"""The follow loop looks around at least this often, whatever it waits for."""


def idle_seconds(ready: bool, log_says_up: bool, next_health: float, deadline: float, now: float) -> float:
    """How long the follow loop may sleep on its line queue before it has something to do: the
    next health check (or the boot deadline while booting), soon when the log says the server
    is up but /health has not answered yet. Lines, and stop or replan requests, wake it earlier."""
    if not ready and log_says_up:
        return HEALTH_RETRY_SECONDS
    due = next_health if ready else min(next_health, deadline)
    return min(max(0.0, due - now), MAX_IDLE_SECONDS)


def check_health(address: BackendAddress, timeout: float = 2.0, path: str = "/health") -> HealthResult:
    """GET /health; 200 is healthy, 503 means vLLM's engine is dead, None that nothing listens."""
    conn = http_connection(address, timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return HealthResult(response.status)
    except (OSError, http.client.HTTPException, MemoryError) as exc:
        return HealthResult(None, f"{type(exc).__name__}: {exc}", own_error=resources_exhausted(exc) is not None)
    finally:
        conn.close()


def fetch_metrics(address: BackendAddress, timeout: float = 2.0) -> str | None:
    """The Prometheus text of /metrics, or None when it cannot be read."""
    conn = http_connection(address, timeout)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        body = response.read()
        return body.decode("utf-8", "replace") if response.status == 200 else None
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


MAX_ANSWER_BYTES = 1 << 20
"""The most of a completion's answer read: a server's reply is outside input, and the probes ask for a
few tokens (a few hundred bytes)."""


def post_completion(
    address: BackendAddress, request: dict[str, object], api_key: str | None, timeout: float, *, purpose: str
) -> tuple[int, bytes] | str:
    """POST /v1/completions to the server: the status and at most MAX_ANSWER_BYTES of the answer, or
    what went wrong when nothing (whole) came back. The one completion of the liveness probe, the
    warm-up and the swap canary.

    `purpose` marks it as dankserve's own, not traffic: the server's access log shows the path with
    `?dankserve=PURPOSE` (vLLM's filter of access lines goes by path alone, so a completion cannot be
    left out) and vLLM's request id (its request log, `cmpl-ID`) is `dankserve-PURPOSE-...`."""
    headers = {"content-type": "application/json", "x-request-id": f"dankserve-{purpose}-{uuid.uuid4().hex}"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    conn = http_connection(address, timeout)
    started = time.monotonic()
    try:
        path = f"/v1/completions?dankserve={purpose}"
        conn.request("POST", path, body=json.dumps(request).encode(), headers=headers)
        response = conn.getresponse()
        return response.status, response.read(MAX_ANSWER_BYTES)
    except TimeoutError:
        return f"no answer within {timeout:.1f} s"
    except (OSError, http.client.HTTPException) as exc:
        return f"{type(exc).__name__}: {exc} after {time.monotonic() - started:.1f} s"
    finally:
        conn.close()


def completion_error(answer: tuple[int, bytes] | str) -> str | None:
    """post_completion's answer judged: None for a completion with choices, and for a 4xx (the API
    answered without the engine: a pooling model has no completions API, a key the probe lacks: that
    proves nothing about the engine and is no failure); else what went wrong."""
    if isinstance(answer, str):
        return answer
    status, payload = answer
    if status >= 500:
        return f"HTTP {status}: {payload[:200].decode('utf-8', 'replace')}"
    if status != 200:
        return None
    try:
        choices = json.loads(payload).get("choices")
    except (ValueError, AttributeError):
        return f"not a completion: {payload[:200].decode('utf-8', 'replace')!r}"
    return None if choices else "the completion has no choices"


def token_probe(address: BackendAddress, model: str, api_key: str | None = None, timeout: float = 30.0) -> str | None:
    """A one-token completion: None when it came back, else what went wrong (the engine may hang
    while /health says 200; only generating a token proves it works). A 4xx answer is no failure."""
    request: dict[str, object] = {"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0}
    return completion_error(post_completion(address, request, api_key, timeout, purpose="liveness-probe"))


class BackgroundProbe:
    """One token probe in its own thread, so a hung engine never blocks the caller's loop."""

    def __init__(self, probe: Callable[[], str | None]) -> None:
        self._done = threading.Event()
        self._error: str | None = None

        def run() -> None:
            try:
                self._error = probe()
            except Exception as exc:  # a bug in the probe is a failed probe, never a dead worker
                self._error = f"{type(exc).__name__}: {exc}"
            finally:
                self._done.set()

        threading.Thread(target=run, name="token-probe", daemon=True).start()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def error(self) -> str | None:
        """The probe's failure (None: it succeeded); read once `done`."""
        return self._error
