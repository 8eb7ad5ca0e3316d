"""Starts the gateway beside the daemon (its own thread and event loop) and stops it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from dankserve.aioserver import GuardedServer, Limits
from dankserve.errors import EnvironmentUnusable
from dankserve.gateway.backends import Supervisor
from dankserve.gateway.proxy import Gateway, QueuePolicy
from dankserve.settings import DeploymentSettings, GatewaySettings, read_secret_file, split_listen


def read_api_key(path: Path) -> str:
    """The gateway's client key; a missing, unreadable or empty file is a config error (exit 2)."""
    return read_secret_file(
        path,
        "gateway.api_key_file",
        fix="write a long random key into it (e.g. `openssl rand -hex 32`), mode 0600, or leave it out on loopback",
    )


def start_gateway(
    settings: GatewaySettings,
    deployments: Callable[[], Mapping[str, DeploymentSettings]],
    supervisor: Supervisor,
) -> GuardedServer:
    """Listen on settings.listen and serve until the returned server is closed."""
    key = read_api_key(settings.api_key_file) if settings.api_key_file is not None else None
    limits = Limits(
        max_connections=settings.max_connections,
        header_timeout=settings.header_timeout_seconds,
        body_timeout=settings.body_timeout_seconds,
        max_body_bytes=settings.max_request_bytes,
    )
    queue = QueuePolicy(settings.queue_size, settings.queue_timeout_seconds, settings.retry_after_seconds)
    gateway = Gateway(deployments, supervisor, limits, queue, key)
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
    return server
