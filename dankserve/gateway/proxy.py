"""The gateway's aiohttp application: /v1/models, and every OpenAI route passed on by `model`.

Responses stream through as the server writes them (SSE included): each chunk is written to
the client as it arrives, never gathered. A client that goes away cancels its handler
(aiohttp's handler cancellation), which closes the upstream connection, so vLLM aborts the
request. A deployment that is not ready holds requests in a bounded per-deployment queue.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog
from aiohttp import web

from dankserve.aioserver import BodyTooLarge, Limits, read_body, vouch
from dankserve.gateway.backends import Availability, Backend, Supervisor
from dankserve.gateway.routing import (
    DEV_ROUTES,
    ROUTED_BY_MODEL,
    Route,
    RoutingError,
    error_document,
    model_entries,
    models_document,
    route_body,
    route_table,
)
from dankserve.settings import DeploymentSettings

log = structlog.get_logger("dankserve.gateway")

POLL_SECONDS = 0.02
"""How often a queued request looks at its deployment again (a dict read under a lock)."""

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "authorization",
    }
)


@dataclass(frozen=True)
class QueuePolicy:
    size: int
    timeout: float
    retry_after: int


class Unavailable(Exception):
    """The deployment cannot take the request now: 503 with Retry-After."""


def _json_error(status: int, message: str, kind: str, param: str | None = None, **headers: str) -> web.Response:
    return web.json_response(error_document(status, message, kind, param), status=status, headers=headers)


class Gateway:
    """Routes requests to deployments; the supervisor says which are ready and where."""

    def __init__(
        self,
        deployments: Callable[[], Mapping[str, DeploymentSettings]],
        supervisor: Supervisor,
        limits: Limits,
        queue: QueuePolicy,
        api_key: str | None,
    ) -> None:
        self._deployments = deployments
        self._supervisor = supervisor
        self._limits = limits
        self._queue = queue
        self._api_key = api_key
        self._waiting: dict[str, int] = {}
        self._tables: tuple[Mapping[str, DeploymentSettings], dict[str, Route]] | None = None
        self._session: aiohttp.ClientSession | None = None
        self.started = int(time.time())

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self._limits.max_body_bytes)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        app.on_startup.append(self._open_session)
        app.on_cleanup.append(self._close_session)
        return app

    async def _open_session(self, app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        )

    async def _close_session(self, app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    def _table(self) -> dict[str, Route]:
        deployments = self._deployments()
        if self._tables is None or self._tables[0] is not deployments:
            self._tables = (deployments, route_table(deployments))
        return self._tables[1]

    def _authorized(self, request: web.Request) -> bool:
        if self._api_key is None:
            return True
        scheme, _, offered = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(offered.encode(), self._api_key.encode())

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path == "/health" and request.method in ("GET", "HEAD"):
            return web.Response(status=200)
        if path in DEV_ROUTES:
            return _json_error(404, f"{path} is not served by the gateway", "NotFoundError")
        if not self._authorized(request):
            return _json_error(401, "missing or wrong API key (Authorization: Bearer KEY)", "AuthenticationError")
        vouch(request)
        if path == "/v1/models" and request.method == "GET":
            return web.json_response(models_document(model_entries(self._deployments()), self.started))
        if path.startswith("/v1/models/") and request.method == "GET":
            wanted = path.removeprefix("/v1/models/")
            listed = models_document(model_entries(self._deployments()), self.started)["data"]
            found = [entry for entry in listed if entry["id"] == wanted]
            if found:
                return web.json_response(found[0])
            return _json_error(404, f"The model `{wanted}` does not exist.", "NotFoundError", "model")
        if path not in ROUTED_BY_MODEL:
            return _json_error(404, f"no route {request.method} {path}", "NotFoundError")
        if request.method != "POST":
            return _json_error(405, f"{path} takes POST", "MethodNotAllowed")
        try:
            body = await read_body(request, self._limits)
        except BodyTooLarge:
            return _json_error(413, f"the request body exceeds {self._limits.max_body_bytes} bytes", "BadRequestError")
        except TimeoutError:
            return _json_error(408, "the request body did not arrive in time", "BadRequestError")
        try:
            routed = route_body(body, self._table())
        except RoutingError as exc:
            return web.json_response(exc.document, status=exc.status)
        name = routed.route.deployment
        try:
            backend = await self._ready(name)
        except Unavailable as exc:
            log.info("gateway_unavailable", deployment=name, reason=str(exc))
            return _json_error(
                503, str(exc), "ServiceUnavailableError", **{"Retry-After": str(self._queue.retry_after)}
            )
        self._supervisor.touched(name)
        try:
            return await self._forward(request, name, backend, routed.body)
        finally:
            self._supervisor.released(name)  # a member busy with requests is never put to sleep

    async def _ready(self, name: str) -> Backend:
        """The deployment's backend once ready; waits in its bounded queue meanwhile (Unavailable otherwise)."""
        backend = self._supervisor.backend(name)
        if backend.availability is Availability.READY:
            return backend
        if backend.availability is Availability.OFF:
            raise Unavailable(f"deployment {name!r} is not running: {backend.message or 'stopped'}")
        if self._waiting.get(name, 0) >= self._queue.size:
            raise Unavailable(f"deployment {name!r} is not ready and {self._queue.size} requests already wait for it")
        self._waiting[name] = self._waiting.get(name, 0) + 1
        try:
            self._supervisor.wake(name)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self._queue.timeout
            while True:
                await asyncio.sleep(POLL_SECONDS)
                backend = self._supervisor.backend(name)
                if backend.availability is Availability.READY:
                    return backend
                if backend.availability is Availability.OFF:
                    raise Unavailable(f"deployment {name!r} did not become ready: {backend.message or 'stopped'}")
                if loop.time() >= deadline:
                    raise Unavailable(f"deployment {name!r} not ready within {self._queue.timeout:g}s")
        finally:
            self._waiting[name] -= 1

    async def _forward(self, request: web.Request, name: str, backend: Backend, body: bytes) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        if backend.api_key is not None:
            headers["Authorization"] = f"Bearer {backend.api_key}"
        host = f"[{backend.host}]" if ":" in backend.host else backend.host
        url = f"http://{host}:{backend.port}{request.path_qs}"
        try:
            upstream = await self._session.request(request.method, url, data=body, headers=headers)
        except aiohttp.ClientError as exc:
            log.warning("gateway_upstream_failed", deployment=name, error=str(exc))
            return _json_error(502, f"deployment {name!r} did not answer: {exc}", "BadGatewayError")
        try:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=_passed(upstream))
            if upstream.content_length is not None:
                response.content_length = upstream.content_length
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response
        except aiohttp.ClientError as exc:
            # The server broke off mid-response, or the client's connection was reset under a write.
            upstream.close()
            log.info("gateway_stream_ended", deployment=name, error=str(exc) or type(exc).__name__)
            if request.transport is not None:
                request.transport.close()
            return response
        except BaseException:
            # The client left (cancelled or reset) or the server broke off: drop the upstream
            # connection rather than return it to the pool, so vLLM sees the abort.
            upstream.close()
            raise
        finally:
            upstream.release()


def _passed(upstream: aiohttp.ClientResponse) -> dict[str, Any]:
    return {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
