"""The readiness and liveness probe: vLLM's /health endpoint over loopback HTTP."""

from __future__ import annotations

import http.client
from dataclasses import dataclass

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


def probe_host_for(bind_host: str) -> str:
    """Where to probe a server bound to `bind_host` (a wildcard bind answers on loopback)."""
    if bind_host in ("0.0.0.0", "", "*"):
        return "127.0.0.1"
    if bind_host == "::":
        return "::1"
    return bind_host


def check_health(host: str, port: int, timeout: float = 2.0, path: str = "/health") -> HealthResult:
    """GET /health; 200 is healthy, 503 means vLLM's engine is dead, None that nothing listens."""
    conn = http.client.HTTPConnection(probe_host_for(host), port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return HealthResult(response.status)
    except (OSError, http.client.HTTPException, MemoryError) as exc:
        return HealthResult(None, f"{type(exc).__name__}: {exc}", own_error=resources_exhausted(exc) is not None)
    finally:
        conn.close()


def fetch_metrics(host: str, port: int, timeout: float = 2.0) -> str | None:
    """The Prometheus text of /metrics, or None when it cannot be read."""
    conn = http.client.HTTPConnection(probe_host_for(host), port, timeout=timeout)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        body = response.read()
        return body.decode("utf-8", "replace") if response.status == 200 else None
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def metric_value(text: str, name: str) -> float | None:
    """The sum over label sets of a Prometheus metric in exposition text (None when absent)."""
    total: float | None = None
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric = head.split("{", 1)[0]
        if metric != name:
            continue
        try:
            total = (total or 0.0) + float(value)
        except ValueError:
            continue
    return total
