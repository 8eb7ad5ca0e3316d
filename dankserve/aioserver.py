"""An aiohttp application served from its own thread and event loop, guarded against slow or
greedy peers (the gateway and the cluster API both face the network).

aiohttp parses requests strictly (llhttp: a negative or non-numeric Content-Length is a 400
before any handler runs) and caps bodies (``client_max_size``), but it has no connection cap
and no deadline for a request's headers: a peer can hold a connection open forever by sending
nothing, or half a request. This module accepts connections itself, so it can:

- count open connections by their sockets (exact: a closed socket's fileno is -1), so file
  descriptors stay bounded: beyond ``max_connections`` a new connection is still served one
  answer, a 503 with `Retry-After` and `Connection: close` (OVERFLOW_ANSWER), while at most
  ``overflow(limits)`` such connections are open; beyond those it is closed at once;
- give each connection ``header_timeout`` from accept (TLS handshake included) to the end of a
  request's headers, and again after each response (keep-alive); a sweeper closes the late;
- leave body deadlines to handlers (``read_body``), which know when they read one;
- tell connections apart by what their last request proved: none read yet (`unproven`), one that
  a handler vouched for (`vouch(request)` once the key or token matched and, for the gateway, the
  key's limits let it in: `trusted`), or one read and not vouched for (`refused`: proven keyless,
  or refused);
- make room, never by guessing: a peer keeps at most ``max_untrusted_per_peer`` idle refused
  connections (and unproven ones idle past ``first_request_grace`` since accept); at
  ``max_connections`` the oldest of those of anyone is closed for the newcomer, then the longest
  idle trusted (keep-alive) one. A connection just accepted is never closed for another (a burst
  of one client's connections, all keyed, is not cut down to the cap before its requests are
  read), nor is one with a request in progress. A peer with its cap of unproven connections gets
  no more once only a quarter of the slots would be left, so a silent flood from one address
  leaves room for everyone else (room_for).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import web

log = structlog.get_logger("dankserve.http")

SWEEP_SECONDS = 0.5
LOG_EVERY_SECONDS = 10.0
SHUTDOWN_SECONDS = 2.0
"""On close, how long handlers still running may take (their connections are already shut)."""
OVERFLOW_RETRY_AFTER = 1
OVERFLOW_ANSWER = {
    "error": {
        "message": "the server has no free connection (max_connections); retry after Retry-After seconds",
        "type": "ServiceUnavailableError",
        "param": None,
        "code": 503,
    }
}
"""A connection beyond the slots gets this (OpenAI's error shape), then is closed."""


class _OneLine(logging.Filter):
    """A peer's malformed request is one warning line, never a traceback in the daemon's log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            detail = " ".join(str(error).split())
            record.msg = f"{record.getMessage()}: {type(error).__name__}: {detail}"[:500]
            record.args = ()
            record.exc_info = None
            record.exc_text = None
        return True


PEER_LOG = logging.getLogger("dankserve.http.peer")
PEER_LOG.addFilter(_OneLine())


@dataclass(frozen=True)
class Limits:
    """How much one server lets its peers take."""

    max_connections: int
    header_timeout: float
    """From accept (or the end of the last response) to the end of the next request's headers."""
    body_timeout: float
    max_body_bytes: int
    max_untrusted_per_peer: int = 8
    """Idle connections of one peer address proven keyless (a request read and refused, none vouched for)
    or unproven past first_request_grace, beyond which its oldest is closed for its next."""
    first_request_grace: float = 2.0
    """A connection that has not sent a request within this (or header_timeout, the shorter) may be closed
    to make room; before it, a new connection is never closed for another."""


def bearer_matches(header: str | None, key: str) -> bool:
    """The Authorization header carries exactly `Bearer KEY` (constant-time comparison)."""
    if header is None or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer ") :].encode(), key.encode())


class BodyTooLarge(Exception):
    """The request body is larger than the server accepts."""


class Throttled:
    """One log line per event name every LOG_EVERY_SECONDS at most, with the count since the last:
    a flood of bad peers must not flood the journal."""

    def __init__(self, logger: Any = None) -> None:
        self._log = log if logger is None else logger
        self._counts: dict[str, int] = {}
        self._logged_at: dict[str, float] = {}

    def note(self, event: str, **fields: object) -> None:
        self._counts[event] = self._counts.get(event, 0) + 1
        now = time.monotonic()
        if now - self._logged_at.get(event, -LOG_EVERY_SECONDS) >= LOG_EVERY_SECONDS:
            self._log.warning(event, count=self._counts[event], **fields)
            self._counts[event] = 0
            self._logged_at[event] = now


@dataclass(eq=False)
class Connection:
    """One accepted connection as the server tracks it."""

    sock: socket.socket
    idle_since: float
    peer: str = ""
    accepted_at: float = 0.0
    busy: int = 0
    trusted: bool = False
    """Its last request was vouched for: closed to make room only when idle, and after every other kind."""
    refused: bool = False
    """Its last request was read and not vouched for (keyless, a wrong key, refused): closed first to make room."""
    vouched: bool = False
    """The request in progress was vouched for (becomes `trusted` when it ends)."""
    overflow: bool = False
    """Accepted beyond the slots: its request gets the 503 of OVERFLOW_ANSWER, then it is closed."""

    def unproven(self) -> bool:
        """No request read on it yet."""
        return not (self.busy or self.trusted or self.refused)

    def suspect(self, now: float, limits: Limits) -> bool:
        """Idle, and proven keyless or silent past the grace since accept: may be closed to make room."""
        if self.busy or self.trusted:
            return False
        grace = min(limits.first_request_grace, limits.header_timeout)
        return self.refused or now - self.accepted_at > grace


_CONNECTION = web.RequestKey("dankserve.connection", Connection)
"""The request's key for its Connection (set by the server's middleware, read by vouch)."""


def vouch(request: web.Request) -> None:
    """The request authenticated (its key or token matched, and whatever limits apply let it in): once it
    ended its connection is trusted, closed to make room only when idle and after every other kind."""
    conn = request.get(_CONNECTION)
    if conn is not None:
        conn.vouched = True


def room_for(connections: list[Connection], peer: str, limits: Limits, now: float) -> tuple[bool, list[Connection]]:
    """Whether a new connection from `peer` may open, and which idle ones to close for it.

    - the peer's oldest suspect (Connection.suspect) goes when it holds its cap of them;
    - a peer already holding its cap of connections that have not sent a request yet gets no more
      once only a quarter of the slots would be left to others (a burst of one client is let in,
      a silent flood leaves room for the rest);
    - when all slots are taken, the oldest suspect of anyone's goes, else the longest idle trusted one;
      refused only when every slot has a request in progress or was accepted within the grace."""
    suspects = sorted((c for c in connections if c.suspect(now, limits)), key=lambda c: c.accepted_at)
    closing: list[Connection] = []
    own = [c for c in suspects if c.peer == peer]
    if len(own) >= limits.max_untrusted_per_peer:
        closing.append(own[0])
    waiting = sum(1 for c in connections if c.peer == peer and c.unproven() and c not in closing)
    if waiting >= limits.max_untrusted_per_peer and len(connections) - len(closing) >= limits.max_connections * 3 // 4:
        return False, []
    if len(connections) - len(closing) >= limits.max_connections:
        others = [c for c in suspects if c not in closing]
        kept_alive = sorted((c for c in connections if c.trusted and not c.busy), key=lambda c: c.idle_since)
        victim = others[0] if others else kept_alive[0] if kept_alive else None
        if victim is None:
            return False, []
        closing.append(victim)
    return True, closing


def overflow(limits: Limits) -> int:
    """Connections beyond max_connections held at once to answer 503 instead of closing them unanswered."""
    return max(8, limits.max_connections // 8)


async def read_body(request: web.Request, limits: Limits) -> bytes:
    """The whole body within the byte limit and the body deadline, whatever form of length it came in.

    Raises BodyTooLarge beyond max_body_bytes (checked against Content-Length first, then while
    reading, so a chunked body counts too) and TimeoutError after body_timeout.
    """
    if request.content_length is not None and request.content_length > limits.max_body_bytes:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    async with asyncio.timeout(limits.body_timeout):
        while True:
            chunk = await request.content.readany()
            if not chunk:
                break
            size += len(chunk)
            if size > limits.max_body_bytes:
                raise BodyTooLarge
            chunks.append(chunk)
    return b"".join(chunks)


class GuardedServer:
    """Serves one aiohttp application on one address from a background thread."""

    def __init__(
        self,
        app: web.Application,
        address: tuple[str, int],
        limits: Limits,
        *,
        name: str,
        tls: ssl.SSLContext | None = None,
        handler_cancellation: bool = False,
    ) -> None:
        self._app = app
        self._limits = limits
        self._tls = tls
        self._name = name
        self._handler_cancellation = handler_cancellation
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind(address)
        except OSError:
            self._listener.close()
            raise
        self._listener.listen(1024)
        self._listener.setblocking(False)
        self._connections: dict[int, Connection] = {}
        self._loop = _new_loop()
        self._started = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.refused = 0
        """Connections closed at once: every slot (or every one of the peer's) busy (for tests and logs)."""
        self.evicted = 0
        """Idle connections closed to make room for a new one."""
        self.turned_away = 0
        """Connections beyond the slots answered 503 (OVERFLOW_ANSWER)."""
        self._throttled = Throttled()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def open_connections(self) -> int:
        return sum(1 for c in self._connections.values() if c.sock.fileno() != -1)

    def start(self) -> None:
        self._thread.start()
        self._started.wait()
        if self._failure is not None:
            raise self._failure

    def close(self, timeout: float = 10.0) -> None:
        if self._thread.is_alive() and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(timeout)
        self._listener.close()

    def call(self, coro: Awaitable[Any], timeout: float | None = None) -> Any:
        """Run a coroutine on the server's loop from another thread (tests, shutdown work)."""
        future = asyncio.run_coroutine_threadsafe(_as_coroutine(coro), self._loop)
        return future.result(timeout)

    # -- the loop's thread ------------------------------------------------------------------------
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        self._app.middlewares.append(self._track)
        runner = web.AppRunner(
            self._app,
            access_log=None,
            handle_signals=False,
            handler_cancellation=self._handler_cancellation,
            keepalive_timeout=self._limits.header_timeout,
            logger=PEER_LOG,
            shutdown_timeout=SHUTDOWN_SECONDS,
        )
        try:
            await runner.setup()
        except BaseException as exc:
            self._failure = exc
            self._started.set()
            return
        server = runner.server
        assert server is not None
        tasks: set[asyncio.Task[None]] = set()
        accept = asyncio.ensure_future(self._accept(server, tasks))
        sweep = asyncio.ensure_future(self._sweep())
        self._started.set()
        log.info(f"{self._name}_listening", address="{}:{}".format(*self.address))
        await self._stopping.wait()
        accept.cancel()
        sweep.cancel()
        for conn in self._connections.values():
            _shut(conn.sock)
        await runner.cleanup()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, accept, sweep, return_exceptions=True)

    async def _accept(self, server: web.Server, tasks: set[asyncio.Task[None]]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, address = await loop.sock_accept(self._listener)
            except OSError as exc:  # EMFILE and friends: wait instead of spinning
                self._throttled.note(f"{self._name}_accept_failed", error=str(exc))
                await asyncio.sleep(0.1)
                continue
            self._prune()
            peer = str(address[0]) if isinstance(address, tuple) and address else ""
            slots = [c for c in self._connections.values() if not c.overflow]
            admit, closing = room_for(slots, peer, self._limits, time.monotonic())
            if not admit and len(self._connections) - len(slots) >= overflow(self._limits):
                self.refused += 1
                sock.close()
                self._throttled.note(f"{self._name}_connection_refused", open=len(self._connections), peer=peer)
                continue
            if not admit:
                self.turned_away += 1
                self._throttled.note(f"{self._name}_connection_turned_away", open=len(slots), peer=peer)
            for victim in closing:
                self.evicted += 1
                del self._connections[victim.sock.fileno()]
                _shut(victim.sock)
                self._throttled.note(f"{self._name}_idle_closed", peer=victim.peer, trusted=victim.trusted)
            now = time.monotonic()
            self._connections[sock.fileno()] = Connection(sock, now, peer=peer, accepted_at=now, overflow=not admit)
            task = asyncio.ensure_future(self._connect(server, sock))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def _connect(self, server: web.Server, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(
                server,  # aiohttp's Server is the protocol factory
                sock,
                ssl=self._tls,
                ssl_handshake_timeout=self._limits.header_timeout if self._tls is not None else None,
            )
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            self._handshake_failed(str(exc) or type(exc).__name__)
            sock.close()

    def _handshake_failed(self, error: str) -> None:
        self._throttled.note(f"{self._name}_handshake_failed", error=error)

    def _prune(self) -> None:
        closed = [fd for fd, conn in self._connections.items() if conn.sock.fileno() == -1]
        for fd in closed:
            del self._connections[fd]

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            self._prune()
            now = time.monotonic()
            for conn in self._connections.values():
                if conn.busy == 0 and now - conn.idle_since > self._limits.header_timeout:
                    _shut(conn.sock)

    @web.middleware
    async def _track(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        conn = self._connection_of(request)
        if conn is not None and conn.overflow:
            busy = web.json_response(OVERFLOW_ANSWER, status=503, headers={"Retry-After": str(OVERFLOW_RETRY_AFTER)})
            busy.force_close()
            return busy
        if conn is not None:
            conn.busy += 1
            conn.vouched = False
            request[_CONNECTION] = conn
        try:
            return await handler(request)
        finally:
            if conn is not None:
                conn.busy -= 1
                conn.idle_since = time.monotonic()
                conn.trusted, conn.refused = conn.vouched, not conn.vouched

    def _connection_of(self, request: web.Request) -> Connection | None:
        transport = request.transport
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is None:
            return None
        conn = self._connections.get(sock.fileno())
        return conn if conn is not None and conn.sock.fileno() == sock.fileno() else None


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop (libuv: less CPU per request and per streamed chunk), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _shut(sock: socket.socket) -> None:
    """End a connection under the transport's feet: it sees EOF and closes its socket itself."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


async def _as_coroutine(awaitable: Awaitable[Any]) -> Any:
    return await awaitable
