"""Starts the gateway beside the daemon (its own thread and event loop) and stops it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from dankserve.aioserver import GuardedServer, Limits
from dankserve.errors import EnvironmentUnusable
from dankserve.gateway.access import Access
from dankserve.gateway.answers import Cors
from dankserve.gateway.backends import Supervisor
from dankserve.gateway.proxy import Gateway, QueuePolicy
from dankserve.settings import DeploymentSettings, GatewaySettings, split_listen


def start_gateway(
    settings: GatewaySettings,
    deployments: Callable[[], Mapping[str, DeploymentSettings]],
    supervisor: Supervisor,
    *,
    current: Callable[[], GatewaySettings | None] | None = None,
    usage_file: Path | None = None,
) -> tuple[GuardedServer, Access]:
    """Listen on settings.listen and serve until the returned server is closed.

    `current`: the settings now (after reloads; the keys are read again when they change);
    `usage_file`: where the usage counters are kept across restarts (None: in memory only)."""
    access = Access(current or (lambda: settings), usage_file)
    limits = Limits(
        max_connections=settings.max_connections,
        header_timeout=settings.header_timeout_seconds,
        body_timeout=settings.body_timeout_seconds,
        max_body_bytes=settings.max_request_bytes,
    )
    queue = QueuePolicy(
        settings.queue_size, settings.queue_timeout_seconds, settings.retry_after_seconds, settings.max_in_flight
    )
    gateway = Gateway(deployments, supervisor, limits, queue, access, cors=Cors(frozenset(settings.allowed_origins)))
    try:
        server = GuardedServer(
            gateway.app(), split_listen(settings.listen), limits, name="gateway", handler_cancellation=True
        )
    except OSError as exc:
        raise EnvironmentUnusable(
            f"the gateway cannot listen on {settings.listen}: {exc.strerror or exc}",
            fix="free that address or set [gateway] listen to another ADDRESS:PORT",
        ) from None
    server.start()
    return server, access
