"""The small HTTPS API between dankserve daemons of a group (aiohttp, mutual TLS).

Endpoints (JSON): ``GET /v1/status`` (hardware, free GPU memory, Ray worker), ``POST /v1/start-worker``,
``POST /v1/stop-worker``.

Who may talk: both ends present a certificate signed by the group's CA (``tls_ca_file``), so a
peer without one never gets past the TLS handshake, and the client checks that the follower's
certificate names the address it dialled. Every request also carries ``Authorization: Bearer
TOKEN``, compared in constant time before anything else happens, so a follower never acts (nor
reads a body) without it.

What a peer can take (dankserve/aioserver.py): at most ``max_connections`` open connections
(the next few answered 503, more closed at once), ``header_timeout_seconds`` from accept to the end of the headers
(the TLS handshake included), ``body_timeout_seconds`` for a body of at most MAX_BODY bytes,
whatever the form of its length (a bad Content-Length is a 400 from the parser; chunked bodies
are counted as they arrive); one request per connection. The server binds only the address the
config names.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import structlog
from aiohttp import web

from dankserve.aioserver import BodyTooLarge, GuardedServer, Limits, Throttled, bearer_matches, read_body, vouch
from dankserve.errors import ConfigError, MemberUnreachable
from dankserve.secret_files import read_secret_file
from dankserve.settings import ClusterSettings, split_listen

log = structlog.get_logger("dankserve.cluster")

MAX_BODY = 64 * 1024
ENDPOINTS = {("GET", "/v1/status"), ("POST", "/v1/start-worker"), ("POST", "/v1/stop-worker")}
DEFAULT_LIMITS = Limits(max_connections=64, header_timeout=5.0, body_timeout=10.0, max_body_bytes=MAX_BODY)


def read_token(path: Path) -> str:
    """The shared token of a group; a missing, unreadable or short token is a config error (exit 2)."""
    return read_secret_file(
        path,
        "cluster token",
        fix="write a long random token (e.g. `openssl rand -hex 32 > FILE`) to the same file on every host, mode 0600",
        min_length=16,
    )


def split_address(address: str, default_port: int) -> tuple[str, int]:
    """'HOST:PORT' (or 'HOST', or '[v6]:PORT') as (host, port)."""
    return split_listen(address, default_port)


@dataclass(frozen=True)
class GroupTls:
    """This host's TLS contexts: the server's (peers must show a CA-signed certificate) and the client's."""

    server: ssl.SSLContext
    client: ssl.SSLContext


def load_tls(ca_file: Path, cert_file: Path, key_file: Path) -> GroupTls:
    """Both contexts from the group's CA and this host's pair; a file that cannot be used is exit 2."""
    fix = "create them with scripts/cluster-certs.sh DIR ADDRESS... (docs/MULTI-HOST.md, TLS between hosts)"
    contexts = []
    for purpose in (ssl.Purpose.CLIENT_AUTH, ssl.Purpose.SERVER_AUTH):
        try:
            context = ssl.create_default_context(purpose, cafile=str(ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cluster.tls_ca_file = {str(ca_file)!r} cannot be used: {exc}", fix=fix) from None
        try:
            context.load_cert_chain(str(cert_file), str(key_file))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cluster.tls_cert_file = {str(cert_file)!r} with tls_key_file = {str(key_file)!r} cannot be used: "
                f"{exc}",
                fix=fix,
            ) from None
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED
        contexts.append(context)
    return GroupTls(server=contexts[0], client=contexts[1])


def tls_of(cluster: ClusterSettings) -> GroupTls:
    return load_tls(cluster.tls_ca_file, cluster.tls_cert_file, cluster.tls_key_file)


def limits_of(cluster: ClusterSettings) -> Limits:
    return Limits(
        max_connections=cluster.max_connections,
        header_timeout=cluster.header_timeout_seconds,
        body_timeout=cluster.body_timeout_seconds,
        max_body_bytes=MAX_BODY,
    )


class ClusterHandler(Protocol):
    """What a daemon does for the API (the follower side)."""

    def status(self) -> dict[str, Any]: ...

    def start_worker(self, request: Mapping[str, Any]) -> dict[str, Any]: ...

    def stop_worker(self, request: Mapping[str, Any]) -> dict[str, Any]: ...


def _reply(status: int, body: Mapping[str, Any]) -> web.Response:
    response = web.json_response(body, status=status)
    response.force_close()
    return response


class _Api:
    def __init__(self, token: str, handler: ClusterHandler, limits: Limits) -> None:
        self.token = token
        self.handler = handler
        self.limits = limits
        self.refusals = Throttled(log)  # a peer retrying with a wrong token must not flood the journal

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.limits.max_body_bytes)
        app.router.add_route("*", "/{tail:.*}", self.dispatch)
        return app

    async def dispatch(self, request: web.Request) -> web.Response:
        if not bearer_matches(request.headers.get("Authorization"), self.token):
            self.refusals.note("cluster_request_refused", peer=request.remote, path=request.path)
            return _reply(401, {"ok": False, "error": "missing or wrong cluster token"})
        vouch(request)
        if (request.method, request.path) not in ENDPOINTS:
            return _reply(404, {"ok": False, "error": f"no endpoint {request.method} {request.path}"})
        body: Any = {}
        if request.method == "POST":
            try:
                raw = await read_body(request, self.limits)
            except BodyTooLarge:
                return _reply(413, {"ok": False, "error": f"request larger than {self.limits.max_body_bytes} bytes"})
            except TimeoutError:
                return _reply(408, {"ok": False, "error": "the request body did not arrive in time"})
            try:
                body = json.loads(raw or b"{}")
            except (json.JSONDecodeError, UnicodeDecodeError):
                body = None
            if not isinstance(body, dict):
                return _reply(400, {"ok": False, "error": "the body must be a JSON object"})
        try:
            # The handler starts processes and reads NVML: off the event loop.
            result = await asyncio.get_running_loop().run_in_executor(None, self._call, request.path, body)
        except Exception as exc:
            log.exception("cluster_request_failed", path=request.path)
            return _reply(500, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return _reply(200 if result.get("ok", True) else 400, result)

    def _call(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        if path == "/v1/status":
            return self.handler.status()
        if path == "/v1/start-worker":
            return self.handler.start_worker(body)
        return self.handler.stop_worker(body)


class ClusterServer:
    """The API server of one daemon, in a background thread with its own event loop."""

    def __init__(
        self,
        address: tuple[str, int],
        token: str,
        handler: ClusterHandler,
        tls: ssl.SSLContext,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self._server = GuardedServer(_Api(token, handler, limits).app(), address, limits, name="cluster_api", tls=tls)

    @property
    def address(self) -> tuple[str, int]:
        return self._server.address

    @property
    def guarded(self) -> GuardedServer:
        return self._server

    def start(self) -> None:
        self._server.start()

    def close(self) -> None:
        self._server.close()


@dataclass(frozen=True)
class ClusterClient:
    """Talks to one follower's API (blocking: called from the daemon's worker threads)."""

    address: str
    token: str
    tls: ssl.SSLContext
    timeout: float = 3.0
    default_port: int = 7390

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        try:
            status, data = asyncio.run(self._request(method, path, body))
        except (OSError, aiohttp.ClientError, TimeoutError, ssl.SSLError) as exc:
            raise MemberUnreachable(f"{self.address}: {exc or type(exc).__name__}") from None
        if status == 401:
            raise ConfigError(
                f"group member {self.address} refused this daemon's cluster token",
                fix="put the same token file content on every host of the group (cluster_token_file)",
            )
        try:
            reply = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise MemberUnreachable(f"{self.address}: answered HTTP {status} without JSON") from None
        if not isinstance(reply, dict) or status != 200:
            error = reply.get("error") if isinstance(reply, dict) else reply
            raise MemberUnreachable(f"{self.address}: HTTP {status}: {error}")
        return reply

    async def _request(self, method: str, path: str, body: Mapping[str, Any] | None) -> tuple[int, bytes]:
        host, port = split_address(self.address, self.default_port)
        netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        data = json.dumps(body or {}).encode() if method == "POST" else None
        connector = aiohttp.TCPConnector(ssl=self.tls, force_close=True)
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with (
            aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
            session.request(method, f"https://{netloc}{path}", data=data, headers=headers) as response,
        ):
            return response.status, await response.content.read(MAX_BODY * 16)

    def status(self) -> dict[str, Any]:
        return self._call("GET", "/v1/status")

    def start_worker(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/start-worker", request)

    def stop_worker(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/stop-worker", request)
