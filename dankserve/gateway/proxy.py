"""The gateway's aiohttp application: /v1/models, and every OpenAI route passed on by `model`.

Responses stream through as the server writes them (SSE included): each chunk is written to
the client as it arrives, never gathered. A client that goes away cancels its handler
(aiohttp's handler cancellation), which closes the upstream connection, so vLLM aborts the
request. A deployment that is not ready holds requests in a bounded per-deployment queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog
from aiohttp import web

from dankserve.aioserver import BodyTooLarge, Limits, Throttled, read_body, vouch
from dankserve.gateway.access import SAVE_SECONDS, Access, Denied
from dankserve.gateway.admission import Admission
from dankserve.gateway.answers import Cors, is_preflight, passed_headers, request_id
from dankserve.gateway.backend_admission import (
    BACKEND_FULL_PAUSE_SECONDS,
    MAX_REFUSAL_BYTES,
    BackendFull,
    is_admission_refusal,
)
from dankserve.gateway.backends import Availability, Backend, Supervisor
from dankserve.gateway.keys import Key
from dankserve.gateway.limits import KeyLimits, Refusal
from dankserve.gateway.recent_requests import Stopwatch, first_byte_timed
from dankserve.gateway.routing import (
    DEV_ROUTES,
    GENERATING,
    ROUTED_BY_MODEL,
    USAGE_ON_REQUEST,
    Readiness,
    Route,
    Routed,
    RoutingError,
    error_document,
    loading_comment,
    model_entries,
    models_document,
    retry_after,
    route_body,
    route_table,
    unknown_model,
)
from dankserve.gateway.tokens import AnswerTally, TokenCount, estimate
from dankserve.gateway.upstream import Upstreams
from dankserve.gateway.usage import CLIENT_CLOSED, NO_LABEL
from dankserve.settings import DeploymentSettings

log = structlog.get_logger("dankserve.gateway")

POLL_SECONDS = 0.02
"""How often a queued request looks at its deployment again (a dict read under a lock)."""
LOADING_COMMENT_SECONDS = 3.0
"""How often a waiting streamed request gets its loading comment again."""


@dataclass(frozen=True)
class QueuePolicy:
    size: int
    timeout: float
    retry_after: int
    max_in_flight: int | None = None
    """Requests passed to a deployment at once (None: the backend's own cap, its --max-num-seqs)."""


class Unavailable(Exception):
    """The deployment cannot take the request now: 503 with Retry-After (the predicted wait, when known)."""

    def __init__(self, message: str, ready_in: float | None = None) -> None:
        super().__init__(message)
        self.ready_in = ready_in


class LoadingStream:
    """A streamed request's SSE answer, begun while it waits so that loading comments reach the client.

    Once begun, the status is 200: what goes wrong later (the wait times out, the server answers an
    error) is one SSE `data:` event in OpenAI's error shape, which OpenAI clients raise as an error."""

    def __init__(self, request: web.Request, model: str) -> None:
        self._request = request
        self._model = model
        self.response: web.StreamResponse | None = None

    async def announce(self, backend: Backend) -> None:
        if self.response is None:
            self.response = web.StreamResponse(
                status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            await self.response.prepare(self._request)
        held = backend.held_for is not None and backend.held_for > 0
        await self.response.write(loading_comment(self._model, backend.state, backend.ready_in, held))

    async def fail(self, document: Mapping[str, Any]) -> web.StreamResponse:
        assert self.response is not None
        return await _end_with_event(self.response, json.dumps(document))


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
        access: Access,
        *,
        cors: Cors | None = None,
    ) -> None:
        self._deployments = deployments
        self._supervisor = supervisor
        self._limits = limits
        self._queue = queue
        self.access = access
        self._cors = cors if cors is not None else Cors()
        self._refusals = Throttled(log)  # a client retrying with a wrong key must not flood the journal
        self._admission = Admission()
        self._released: dict[str, asyncio.Event] = {}
        self._tables: tuple[Mapping[str, DeploymentSettings], dict[str, Route]] | None = None
        self._upstreams = Upstreams()
        """One session per backend socket (aiohttp's UnixConnector has one path); a few, one per deployment."""
        self.started = int(time.time())

    def app(self, *mounts: Callable[[web.Application], None]) -> web.Application:
        """The application; `mounts` add their routes first (the console), ahead of the catch-all."""
        app = web.Application(client_max_size=self._limits.max_body_bytes)
        for mount in mounts:
            mount(app)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        app.on_response_prepare.append(self._cors.on_prepare())
        app.on_startup.append(lambda app: self._upstreams.open())
        app.on_cleanup.append(lambda app: self._upstreams.close())
        app.cleanup_ctx.append(self._saving)
        return app

    async def _saving(self, app: web.Application) -> Any:
        """Write the usage counters every SAVE_SECONDS (off the loop), and once more at close."""
        loop = asyncio.get_running_loop()

        async def every() -> None:
            while True:
                await asyncio.sleep(SAVE_SECONDS)
                await loop.run_in_executor(None, self.access.save)

        task = asyncio.create_task(every())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await loop.run_in_executor(None, self.access.save)

    def _table(self) -> dict[str, Route]:
        deployments = self._deployments()
        if self._tables is None or self._tables[0] is not deployments:
            self._tables = (deployments, route_table(deployments))
        return self._tables[1]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path == "/health" and request.method in ("GET", "HEAD"):
            return web.Response(status=200)
        if is_preflight(request):
            return self._cors.preflight(request)
        if path in DEV_ROUTES:
            return _json_error(404, f"{path} is not served by the gateway", "NotFoundError")
        key = self.access.identify(request.headers.getall("Authorization", []))
        if isinstance(key, Denied):
            self.access.record(NO_LABEL, NO_LABEL, key.status, TokenCount())
            self._refusals.note("gateway_denied", status=key.status, reason=key.message, path=path)
            return _json_error(key.status, key.message, "AuthenticationError", **{"WWW-Authenticate": "Bearer"})
        if path == "/v1/models" and request.method == "GET":
            vouch(request)
            return web.json_response(self._models(key))
        if path.startswith("/v1/models/") and request.method == "GET":
            vouch(request)
            return _one_model(self._models(key)["data"], path.removeprefix("/v1/models/"))
        if path not in ROUTED_BY_MODEL:
            return _json_error(404, f"no route {request.method} {path}", "NotFoundError")
        if request.method != "POST":
            return _json_error(405, f"{path} takes POST", "MethodNotAllowed")
        refused = self.access.admit(key)  # before the body: a key over its limits holds no connection with one
        if refused is not None:
            return _limited(self.access, self._refusals, key, NO_LABEL, refused)
        return await self._let_in(request, key)

    async def _let_in(self, request: web.Request, key: Key) -> web.StreamResponse:
        """A request its key's limits let in (in flight until it ends): its body read, routed, its estimated
        tokens charged, then passed on (its connection trusted only now); the tokens settled when it ends."""
        tally: AnswerTally | None = None
        reserved, status, label, watch = 0, 500, "", Stopwatch(time.monotonic())
        try:
            routed = await _read_routed(request, key, self._limits, self._table(), self.access, refusals=self._refusals)
            if isinstance(routed, web.Response):
                return routed
            wanted = estimate(len(routed.body), routed.max_tokens, request.path in GENERATING)
            refused = self.access.reserve(key, wanted)
            if refused is not None:
                return _limited(self.access, self._refusals, key, routed.model, refused)
            reserved, label = KeyLimits.reserved(key, wanted), routed.model
            vouch(request)
            tally = AnswerTally(routed.streamed, drop_usage=routed.usage_added)
            status, response = await self._admitted(request, key, routed, tally, watch)
            return response
        except asyncio.CancelledError:
            # The client left (aiohttp cancels its handler): not the server's failure. One that left after the
            # stream's [DONE] (an SDK closes as soon as it reads it) had its whole 200.
            status = 200 if tally is not None and tally.ended else CLIENT_CLOSED
            raise
        finally:
            tokens = tally.count() if tally is not None else TokenCount()
            self.access.release(key, tokens.total, reserved, passed_on=tally is not None)
            if tally is not None:
                self.access.record(key.name, label, status, tokens, watch)

    async def _admitted(
        self, request: web.Request, key: Key, routed: Routed, tally: AnswerTally, watch: Stopwatch
    ) -> tuple[int, web.StreamResponse]:
        """A routed request of a key within its limits: waits for its deployment, then is passed on."""
        name = routed.route.deployment
        loading = LoadingStream(request, routed.route.served_name) if routed.streamed else None
        deadline = time.monotonic() + self._queue.timeout
        while True:
            waited = time.monotonic()
            try:
                backend = await self._ready(name, loading, key.priority)
            except Unavailable as exc:
                self._refusals.note("gateway_unavailable", deployment=name, reason=str(exc), key=key.name)
                return 503, await _unavailable(str(exc), loading, retry_after(exc.ready_in, self._queue.retry_after))
            finally:
                watch.queued_seconds += time.monotonic() - waited
            self._supervisor.touched(name)
            try:
                with contextlib.suppress(BackendFull):  # vLLM's own queue is full: wait as a queued request, ask again
                    return await self._forward(
                        request, name, backend, routed.body, _begun(loading), tally=tally, watch=watch
                    )
            finally:
                self._supervisor.released(name)  # a member busy with requests is never put to sleep
                self._admission.leave(name)
                self._released.pop(name, _NO_EVENT).set()
            if not await _pause_before_retry(deadline):
                return 503, await _backend_full(name, loading, self._queue)

    def _models(self, key: Key) -> dict[str, Any]:
        """The models the key may use."""
        return _models_document(key, self._deployments(), self._supervisor, self.started)

    async def _ready(self, name: str, loading: LoadingStream | None = None, priority: int = 0) -> Backend:
        """The deployment's backend once ready and admitted (Unavailable otherwise); waits in its bounded queue
        meanwhile: while it boots or wakes, and while `max_in_flight` requests are in flight (highest priority
        first). Once this returns, the request counts in flight until `_admission.leave`.

        A wait never outlasts queue_timeout_seconds: one held by the swap bound past it is refused at once.
        A streamed request's `loading` gets a comment at once and every LOADING_COMMENT_SECONDS."""
        backend = self._supervisor.backend(name)
        if backend.availability is Availability.READY and self._admission.enter(name, self._cap(backend)):
            return backend
        if backend.availability is Availability.OFF:
            raise Unavailable(f"deployment {name!r} is not running: {backend.message or 'stopped'}")
        if self._admission.waiting(name) >= self._queue.size and not self._displace(name, priority):
            if backend.availability is Availability.READY:
                raise Unavailable(
                    f"deployment {name!r} has {self._admission.in_flight(name)} requests in flight (its cap) and "
                    f"{self._queue.size} more already wait",
                )
            raise Unavailable(
                f"deployment {name!r} is not ready and {self._queue.size} requests already wait for it",
                backend.ready_in,
            )
        ticket = self._admission.queue(name, priority)
        try:
            if backend.availability is not Availability.READY:
                self._supervisor.wake(name)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self._queue.timeout
            announce_at = loop.time()
            while True:
                if self._admission.displaced(ticket):
                    raise Unavailable(
                        f"deployment {name!r} has {self._queue.size} requests waiting and one of a higher key "
                        "priority took this request's place",
                        backend.ready_in,
                    )
                if backend.availability is Availability.READY:
                    if self._admission.take(ticket, self._cap(backend)):
                        return backend
                    released = self._released.setdefault(name, asyncio.Event())
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            released.wait(), min(POLL_SECONDS * 10, max(0.0, deadline - loop.time()))
                        )
                else:
                    _check_held(name, backend, deadline - loop.time())
                    if loading is not None and loop.time() >= announce_at:
                        await loading.announce(backend)
                        announce_at = loop.time() + LOADING_COMMENT_SECONDS
                    await asyncio.sleep(POLL_SECONDS)
                before, backend = backend, self._supervisor.backend(name)
                if backend.availability is Availability.OFF:
                    raise Unavailable(f"deployment {name!r} did not become ready: {backend.message or 'stopped'}")
                if backend.availability is Availability.ASLEEP and before.availability is not Availability.ASLEEP:
                    self._supervisor.wake(name)  # it fell asleep meanwhile (a swap away from it): wake it again
                if loop.time() >= deadline:
                    if backend.availability is Availability.READY and self._admission.take(ticket, self._cap(backend)):
                        return backend
                    raise Unavailable(
                        f"deployment {name!r} not ready within {self._queue.timeout:g}s"
                        if backend.availability is not Availability.READY
                        else f"deployment {name!r} had no room within {self._queue.timeout:g}s "
                        f"({self._admission.in_flight(name)} requests in flight, its cap)",
                        backend.ready_in,
                    )
        finally:
            self._admission.drop(ticket)
            if self._admission.waiting(name) and name in self._released:
                self._released.pop(name).set()  # the next in line may be first now

    def _displace(self, name: str, priority: int) -> bool:
        """Make room in a full queue for a request of `priority`: the last in line of a lower one is told to leave
        (503); its waiter is woken to see it."""
        if self._queue.size == 0 or self._admission.displace(name, priority) is None:
            return False
        self._released.pop(name, _NO_EVENT).set()
        return True

    def _cap(self, backend: Backend) -> int | None:
        return self._queue.max_in_flight if self._queue.max_in_flight is not None else backend.max_in_flight

    async def _forward(
        self,
        request: web.Request,
        name: str,
        backend: Backend,
        body: bytes,
        begun: web.StreamResponse | None,
        *,
        tally: AnswerTally,
        watch: Stopwatch,
    ) -> tuple[int, web.StreamResponse]:
        """Pass the request on and stream the answer back: the status to count and the answer; `begun`: the SSE
        answer its loading comments began (status sent), into which the server's events go, or its error as one
        event."""
        if backend.address is None:
            return 502, _json_error(502, f"deployment {name!r} has no address", "BadGatewayError")
        try:
            upstream = await self._upstreams.session(backend.address).request(
                request.method, backend.address.url(request.path_qs), data=body, headers=_headers(request, backend)
            )
        except aiohttp.ClientError as exc:
            log.warning("gateway_upstream_failed", deployment=name, error=str(exc), request_id=request_id(request))
            message = f"deployment {name!r} did not answer: {exc}"
            if begun is not None:
                return 502, await _end_with_event(begun, json.dumps(error_document(502, message, "BadGatewayError")))
            return 502, _json_error(502, message, "BadGatewayError")
        refusal = await _read_refusal(upstream, name)  # vLLM's admission refusal is the gateway's, never passed raw
        try:
            response = (
                begun
                if begun is not None
                else web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=_passed(upstream))
            )
            if begun is None:
                if upstream.content_length is not None:
                    response.content_length = upstream.content_length
                await response.prepare(request)
            elif upstream.status != 200:  # an error document (JSON): the one event of the stream
                text = refusal or await upstream.content.read(1 << 16)
                document = " ".join(text.decode(errors="replace").splitlines())
                return upstream.status, await _end_with_event(response, document)
            await _write_read(response, tally, refusal)  # another 503, read to judge it: passed on as it came
            async for chunk in first_byte_timed(upstream.content.iter_any(), watch, time.monotonic):
                passed = tally.feed(chunk)
                if passed:
                    await response.write(passed)
            rest = tally.finish()
            if rest:
                await response.write(rest)
            await response.write_eof()
            return response.status, response
        except aiohttp.ClientError as exc:
            # The server broke off mid-response, or the client's connection was reset under a write.
            upstream.close()
            if tally.streamed and not _client_left(request):  # end it as vLLM ends a failed stream
                message = f"deployment {name!r} broke off its answer: {exc or type(exc).__name__}"
                with contextlib.suppress(ConnectionError, aiohttp.ClientError):
                    await _end_with_event(response, json.dumps(error_document(502, message, "BadGatewayError")))
            return (CLIENT_CLOSED if _broken_off(request, name, exc) else response.status), response
        except BaseException:
            # The client left (cancelled or reset) or the server broke off: drop the upstream
            # connection rather than return it to the pool, so vLLM sees the abort.
            upstream.close()
            raise
        finally:
            upstream.release()


def _models_document(
    key: Key, deployments: Mapping[str, DeploymentSettings], supervisor: Supervisor, started: int
) -> dict[str, Any]:
    """`/v1/models` for the key: the names it may use, each with its deployment's readiness."""
    entries = [e for e in model_entries(deployments) if key.allows([e.id])]
    readiness = {}
    for deployment in dict.fromkeys(e.deployment for e in entries):
        backend = supervisor.backend(deployment)
        ready_in = 0.0 if backend.availability is Availability.READY else backend.ready_in
        readiness[deployment] = Readiness(backend.state or backend.availability.value, ready_in, backend.max_model_len)
    return models_document(entries, started, readiness)


def _one_model(listed: list[dict[str, Any]], wanted: str) -> web.Response:
    """`/v1/models/NAME`: its card, or the 404 of a model that does not exist (a hidden one answers the same)."""
    found = [entry for entry in listed if entry["id"] == wanted]
    if found:
        return web.json_response(found[0])
    unknown = unknown_model(wanted)
    return web.json_response(unknown.document, status=unknown.status)


async def _read_routed(
    request: web.Request, key: Key, limits: Limits, table: Mapping[str, Route], access: Access, *, refusals: Throttled
) -> Routed | web.Response:
    """A let-in request's body read within the limits and routed, for a model its key may use; else the answer
    (413, 408, 400, 404: a model outside its scope is answered as one that does not exist)."""
    try:
        body = await read_body(request, limits)
    except BodyTooLarge:
        return _json_error(413, f"the request body exceeds {limits.max_body_bytes} bytes", "BadRequestError")
    except TimeoutError:
        return _json_error(408, "the request body did not arrive in time", "BadRequestError")
    try:
        routed = route_body(body, table, ask_usage=request.path in USAGE_ON_REQUEST)
    except RoutingError as exc:
        return web.json_response(exc.document, status=exc.status)
    if not key.allows([routed.model]):  # answered as a model that does not exist: /v1/models hides it too
        hidden = unknown_model(routed.model)
        access.record(key.name, routed.model, hidden.status, TokenCount())
        refusals.note("gateway_forbidden", key=key.name, model=routed.model)
        return web.json_response(hidden.document, status=hidden.status)
    return routed


def _limited(access: Access, refusals: Throttled, key: Key, model: str, refused: Refusal) -> web.Response:
    access.record(key.name, model, 429, TokenCount())
    refusals.note("gateway_limited", key=key.name, model=model, limit=refused.limit)
    message = f"the API key {key.name!r} is over its {refused.limit} ({refused.value}); retry later"
    return _json_error(429, message, "RateLimitError", **{"Retry-After": str(refused.retry_after)})


_NO_EVENT = asyncio.Event()
"""Set when a deployment's release finds no one waiting (no event made for it)."""


def _client_left(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


def _broken_off(request: web.Request, name: str, exc: aiohttp.ClientError) -> bool:
    """Log an answer broken off mid-way and close the client's connection; True when the client had left."""
    client_left = _client_left(request)
    log.info(
        "gateway_stream_ended",
        deployment=name,
        error=str(exc) or type(exc).__name__,
        by="client" if client_left else "server",
        request_id=request_id(request),
    )
    if request.transport is not None:
        request.transport.close()
    return client_left


async def _unavailable(message: str, loading: LoadingStream | None, wait: int) -> web.StreamResponse:
    """The gateway's 503: its error event where a streamed answer began, else with Retry-After."""
    if loading is not None and loading.response is not None:
        return await loading.fail(error_document(503, message, "ServiceUnavailableError"))
    return _json_error(503, message, "ServiceUnavailableError", **{"Retry-After": str(wait)})


async def _backend_full(name: str, loading: LoadingStream | None, queue: QueuePolicy) -> web.StreamResponse:
    """The gateway's own 503 for a request vLLM's admission kept refusing past its queue time."""
    message = (
        f"deployment {name!r} is full: vLLM's own admission (--max-num-queued-reqs) refused the request "
        f"for {queue.timeout:g}s"
    )
    return await _unavailable(message, loading, queue.retry_after)


async def _read_refusal(upstream: aiohttp.ClientResponse, name: str) -> bytes:
    """A 503's body, read to judge it (b"" for any other status); BackendFull when it is vLLM's admission refusal."""
    if upstream.status != 503:
        return b""
    body = await upstream.content.read(MAX_REFUSAL_BYTES + 1)
    if is_admission_refusal(upstream.status, body):
        log.info("gateway_backend_full", deployment=name)
        upstream.release()
        raise BackendFull
    return body


async def _write_read(response: web.StreamResponse, tally: AnswerTally, body: bytes) -> None:
    """The part of an answer already read (to judge it), passed on first."""
    if body:
        tally.feed(body)
        await response.write(body)


def _begun(loading: LoadingStream | None) -> web.StreamResponse | None:
    """The SSE answer a waiting streamed request's loading comments began (None: none began)."""
    return loading.response if loading is not None else None


async def _pause_before_retry(deadline: float) -> bool:
    """After vLLM's admission refused: wait a moment and say whether the request may ask again before its deadline."""
    if time.monotonic() + BACKEND_FULL_PAUSE_SECONDS >= deadline:
        return False
    await asyncio.sleep(BACKEND_FULL_PAUSE_SECONDS)
    return True


async def _end_with_event(response: web.StreamResponse, data: str) -> web.StreamResponse:
    """End a begun SSE answer with one `data:` event (an error document), then `data: [DONE]` as vLLM ends a
    stream that failed (clients that read to [DONE] stop there; OpenAI's SDK raises at the error first)."""
    await response.write(f"data: {data}\n\ndata: [DONE]\n\n".encode())
    await response.write_eof()
    return response


def _check_held(name: str, backend: Backend, left: float) -> None:
    """Unavailable when the swap bound holds the wake past what is left of the request's wait."""
    held = backend.held_for
    if held is not None and held > 0 and (backend.ready_in or held) > left:
        raise Unavailable(
            f"deployment {name!r} waits for its swap group's next allowed swap (max_swaps_per_minute) in "
            f"{held:.0f} s, past the {left:.0f} s this request may still wait",
            backend.ready_in if backend.ready_in is not None else held,
        )


def _headers(request: web.Request, backend: Backend) -> dict[str, str]:
    headers = passed_headers(request.headers, request.headers.getall("Connection", []))
    headers["X-Request-Id"] = request_id(request)  # vLLM's request id: its log lines name the client's request
    if backend.api_key is not None:
        headers["Authorization"] = f"Bearer {backend.api_key}"
    return headers


def _passed(upstream: aiohttp.ClientResponse) -> dict[str, Any]:
    return passed_headers(upstream.headers, upstream.headers.getall("Connection", []))
