"""The small HTTP API between dankserve daemons of a group (stdlib only).

Endpoints (JSON): ``GET /v1/status`` (hardware, free GPU memory, Ray worker), ``POST /v1/start-worker``,
``POST /v1/stop-worker``. Every request carries ``Authorization: Bearer TOKEN``; the token is
read from a file and compared in constant time before anything else happens, so a follower
never acts (nor reads a body) without it. The server binds only the address the config names.
"""

from __future__ import annotations

import hmac
import http.client
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

import structlog

from dankserve.errors import ConfigError, MemberUnreachable

log = structlog.get_logger("dankserve.cluster")

MAX_BODY = 64 * 1024
ENDPOINTS = {("GET", "/v1/status"), ("POST", "/v1/start-worker"), ("POST", "/v1/stop-worker")}


def read_token(path: Path) -> str:
    """The shared token of a group; a missing, unreadable or short token is a config error (exit 2)."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(
            f"cluster token file {path} cannot be read: {exc.strerror}",
            fix="create it with the same random token on every host (e.g. `openssl rand -hex 32 > FILE`), mode 0600",
        ) from None
    if len(token) < 16:
        raise ConfigError(
            f"cluster token in {path} is {len(token)} characters long: at least 16 are needed",
            fix="write a long random token (e.g. `openssl rand -hex 32`) to the same file on every host",
        )
    return token


def split_address(address: str, default_port: int) -> tuple[str, int]:
    """'HOST:PORT' (or 'HOST', or '[v6]:PORT') as (host, port)."""
    text = address.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else default_port
    if text.count(":") == 1:
        host, port = text.split(":")
        return host, int(port)
    return text, default_port


def token_matches(header: str | None, token: str) -> bool:
    """The Authorization header carries exactly this token (constant-time comparison)."""
    if header is None or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer ") :].encode(), token.encode())


class ClusterHandler(Protocol):
    """What a daemon does for the API (the follower side)."""

    def status(self) -> dict[str, Any]: ...

    def start_worker(self, request: Mapping[str, Any]) -> dict[str, Any]: ...

    def stop_worker(self, request: Mapping[str, Any]) -> dict[str, Any]: ...


class _RequestHandler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return  # requests are logged by the handler that acts on them

    def _reply(self, code: int, body: Mapping[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _dispatch(self, method: str) -> None:
        if not token_matches(self.headers.get("Authorization"), self.server.token):
            log.warning("cluster_request_refused", peer=self.client_address[0], path=self.path)
            self.close_connection = True
            self._reply(401, {"ok": False, "error": "missing or wrong cluster token"})
            return
        if (method, self.path) not in ENDPOINTS:
            self._reply(404, {"ok": False, "error": f"no endpoint {method} {self.path}"})
            return
        request: Any = {}
        if method == "POST":
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._reply(413, {"ok": False, "error": "request too large"})
                return
            try:
                request = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError:
                request = None
            if not isinstance(request, dict):
                self._reply(400, {"ok": False, "error": "the body must be a JSON object"})
                return
        handler = self.server.handler
        try:
            if self.path == "/v1/status":
                result = handler.status()
            elif self.path == "/v1/start-worker":
                result = handler.start_worker(request)
            else:
                result = handler.stop_worker(request)
        except Exception as exc:
            log.exception("cluster_request_failed", path=self.path)
            self._reply(500, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            return
        self._reply(200 if result.get("ok", True) else 400, result)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], token: str, handler: ClusterHandler) -> None:
        self.token = token
        self.handler = handler
        super().__init__(address, _RequestHandler)


class ClusterServer:
    """The API server of one daemon, in a background thread."""

    def __init__(self, address: tuple[str, int], token: str, handler: ClusterHandler) -> None:
        self._server = _Server(address, token, handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="cluster-api", daemon=True
        )

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        self._thread.start()
        log.info("cluster_api_listening", address=f"{self.address[0]}:{self.address[1]}")

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@dataclass(frozen=True)
class ClusterClient:
    """Talks to one follower's API."""

    address: str
    token: str
    timeout: float = 3.0
    default_port: int = 7390

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        host, port = split_address(self.address, self.default_port)
        conn = http.client.HTTPConnection(host, port, timeout=self.timeout)
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        try:
            conn.request(method, path, body=json.dumps(body or {}) if method == "POST" else None, headers=headers)
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise MemberUnreachable(f"{self.address}: {exc}") from None
        finally:
            conn.close()
        if response.status == 401:
            raise ConfigError(
                f"group member {self.address} refused this daemon's cluster token",
                fix="put the same token file content on every host of the group (cluster_token_file)",
            )
        try:
            reply = json.loads(data)
        except json.JSONDecodeError:
            raise MemberUnreachable(f"{self.address}: answered HTTP {response.status} without JSON") from None
        if not isinstance(reply, dict) or response.status != 200:
            error = reply.get("error") if isinstance(reply, dict) else reply
            raise MemberUnreachable(f"{self.address}: HTTP {response.status}: {error}")
        return reply

    def status(self) -> dict[str, Any]:
        return self._call("GET", "/v1/status")

    def start_worker(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/start-worker", request)

    def stop_worker(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/stop-worker", request)
