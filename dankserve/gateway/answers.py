"""What every gateway answer carries besides its body: the request's `X-Request-Id` and, for browsers of the
origins `[gateway] allowed_origins` names, CORS; and which request headers never go upstream (hop-by-hop).

The id is the client's own `X-Request-Id` when it sent one that is safe to log and pass on (vLLM takes it as
its request id: `chatcmpl-ID`), else one the gateway makes; the same id goes upstream and back on the answer
(401s and 404s included), so a client's report, the gateway's log and vLLM's log name one request.

CORS as vLLM's own server does it (Starlette's CORSMiddleware), but closed by default: a preflight (`OPTIONS`
with `Origin` and `Access-Control-Request-Method`) is answered here before any key is asked for (a browser
never sends credentials on a preflight, so a 401 would fail every cross-origin call): 204 with the allowed
method and headers for an allowed origin, 403 naming the setting for another. An allowed origin's other
answers carry `Access-Control-Allow-Origin` and expose `X-Request-Id` and `Retry-After`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

from aiohttp import web

from dankserve.gateway.routing import error_document

REQUEST_ID = "X-Request-Id"
_SAFE_ID = re.compile(r"[A-Za-z0-9._~:/+=@-]{1,128}")
"""A client's id is passed on as it is only within this: what vLLM's and the gateway's log lines keep intact."""
_ID = web.RequestKey("dankserve.request_id", str)

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "authorization",
        "x-request-id",
    }
)
"""Never passed on as received (RFC 9110 7.6.1; the key and the id are the gateway's to set)."""


def passed_headers(headers: Mapping[str, str], connection: Iterable[str]) -> dict[str, str]:
    """`headers` less the hop-by-hop ones and those the `Connection` header(s) name (RFC 9110 7.6.1: a
    client may mark any header hop-by-hop, e.g. `Connection: X-Forwarded-For`: it is for the gateway alone)."""
    named = {token.strip().lower() for value in connection for token in value.split(",")}
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP and k.lower() not in named}


def request_id(request: web.Request) -> str:
    """The request's id: the client's one `X-Request-Id` when safe, else a new one; the same on every call."""
    known = request.get(_ID)
    if known is None:
        sent = request.headers.getall(REQUEST_ID, [])
        known = sent[0] if len(sent) == 1 and _SAFE_ID.fullmatch(sent[0]) else uuid.uuid4().hex
        request[_ID] = known
    return known


@dataclass(frozen=True)
class Cors:
    """The origins `[gateway] allowed_origins` names ("*": any)."""

    allowed: frozenset[str] = frozenset()

    def allows(self, origin: str) -> bool:
        return "*" in self.allowed or origin in self.allowed

    def preflight(self, request: web.Request) -> web.Response:
        origin = request.headers.get("Origin", "")
        if not self.allows(origin):
            message = f"the origin {origin!r} is not in [gateway] allowed_origins; add it there to call from a browser"
            return web.json_response(error_document(403, message, "PermissionDeniedError"), status=403)
        headers = {"Access-Control-Allow-Methods": "GET, POST, OPTIONS", "Access-Control-Max-Age": "600"}
        asked = request.headers.get("Access-Control-Request-Headers")
        if asked:
            headers["Access-Control-Allow-Headers"] = asked  # as vLLM's allow_headers=["*"]: any header
        return web.Response(status=204, headers=headers)

    def on_prepare(self) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
        """The hook (aiohttp's on_response_prepare) that stamps every answer before its headers go out."""

        async def stamp(request: web.Request, response: web.StreamResponse) -> None:
            response.headers[REQUEST_ID] = request_id(request)
            origin = request.headers.get("Origin")
            if origin is not None and self.allows(origin):
                response.headers["Access-Control-Allow-Origin"] = "*" if "*" in self.allowed else origin
                response.headers["Access-Control-Expose-Headers"] = f"{REQUEST_ID}, Retry-After"
                if "*" not in self.allowed:
                    response.headers.add("Vary", "Origin")

        return stamp


def is_preflight(request: web.Request) -> bool:
    return (
        request.method == "OPTIONS"
        and "Origin" in request.headers
        and "Access-Control-Request-Method" in request.headers
    )
