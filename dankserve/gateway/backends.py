"""What the gateway asks the supervisor: is a deployment ready, where does it listen, wake it.

The gateway never decides a deployment's lifecycle: it reads an `Availability` and, for one
that is not ready, calls `wake` (today a deployment is only ever booting, restarting or ready;
swap groups answer `ASLEEP` and start a wake there). `touched` tells the supervisor a request
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


class Supervisor(Protocol):
    """The supervisor's side of the gateway."""

    def backend(self, deployment: str) -> Backend: ...

    def wake(self, deployment: str) -> None:
        """Ask for the deployment to become ready; returns at once, the outcome shows in `backend`."""

    def touched(self, deployment: str) -> None:
        """A request was routed to the deployment (now)."""
