"""What the gateway asks the supervisor: is a deployment ready, where does it listen, wake it.

The gateway never decides a deployment's lifecycle: it reads an `Availability` and, for one
that is not ready, calls `wake` (swap groups answer `ASLEEP` and start a wake there; an awake
member finishing its requests before a swap away from it answers `PENDING`, state `draining`).
Predicted ready seconds come with it (from the boot and wake history). `touched` tells the supervisor a request
went to a deployment, so least-recently-used and idle-sleep choices can follow the traffic.
Every method is called from the gateway's event loop: each must return at once (no I/O).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class Availability(StrEnum):
    READY = "ready"
    """Serving: pass requests on now."""
    PENDING = "pending"
    """Booting, restarting or waking: requests wait in the bounded queue."""
    ASLEEP = "asleep"
    """Put to sleep (swap groups): `wake` makes it PENDING, then READY; requests wait meanwhile."""
    OFF = "off"
    """Stopped, taken down, failed, or a wake that failed: requests get 503 at once."""


@dataclass(frozen=True)
class Backend:
    """One deployment as the gateway sees it."""

    availability: Availability
    host: str
    port: int
    api_key: str | None = None
    """The key the server wants (read by the supervisor from api_key_file), sent upstream."""
    message: str | None = None
    """Why it is not ready, for the 503's message."""
    state: str | None = None
    """What it does, in a word clients see (/v1/models, loading comments): ready, asleep, waking,
    starting, restarting, draining (finishing its requests before a swap away from it), ..."""
    ready_in: float | None = None
    """Predicted seconds until it is ready (0 when ready; None: no history to predict from)."""
    held_for: float | None = None
    """Seconds until its swap group's bound (`max_swaps_per_minute`) lets its wake begin (None: not held)."""
    max_in_flight: int | None = None
    """Requests the gateway passes to it at once: its plan's --max-num-seqs (None: not known, no cap)."""
    max_model_len: int | None = None
    """Its server's context length as the boot's log told (None: not booted yet), for /v1/models."""


class Supervisor(Protocol):
    """The supervisor's side of the gateway."""

    def backend(self, deployment: str) -> Backend: ...

    def wake(self, deployment: str) -> None:
        """Ask for the deployment to become ready; returns at once, the outcome shows in `backend`."""

    def touched(self, deployment: str) -> None:
        """A request was routed to the deployment (now): it is in flight until `released`."""

    def released(self, deployment: str) -> None:
        """A request routed to the deployment ended (answered, failed or cancelled)."""
