"""The console's routes on the gateway's aiohttp application (added before the gateway's catch-all).

    GET  /ui/                 the page (static: it holds no data)
    GET  /ui/static/NAME      its CSS and JS
    GET  /ui/api/status       the `status --json` document            (scope `console`)
    GET  /ui/api/status/events  the same document as SSE, each time it is read anew (every STATUS_SECONDS, at once
                              after an action) while any page follows it: what the page reads (scope `console`)
    GET  /ui/api/usage        the `usage --json` rows                 (scope `console`)
    GET  /ui/api/requests     the last requests, newest first         (scope `console`)
    GET  /ui/api/logs         the daemon's and the servers' lines, then each new one, as SSE; `?deployment=NAME`
                              for one deployment's                    (scope `console`)
    POST /ui/api/action       {"action": VERB, "deployment": NAME}    (scope `console:admin`)
    GET  /running             llama-swap's shape: {"running": [{"model", "state", ...}]}  (scope `console`)
    POST /unload              llama-swap's: every awake swap-group member sleeps; "OK"  (scope `console:admin`)

Every answer carries a strict Content-Security-Policy (scripts and styles from the gateway only, no
inline script, no framing). The control verbs block (a sleep waits for its outcome), so they run in
the loop's thread pool; the answer goes back as the control socket gave it (the CLI's own words).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from typing import Any, Protocol

from aiohttp import web

from dankserve.gateway.access import Access, Denied
from dankserve.gateway.console.guard import ACTION_HEADER, Verdict, action_request, keyless
from dankserve.gateway.keys import CONSOLE, CONSOLE_ADMIN
from dankserve.gateway.recent_requests import RECENT_REQUESTS, hide_request_keys
from dankserve.gateway.usage import hide_key_names, usage_rows

Control = Callable[[Mapping[str, Any]], Mapping[str, Any]]
"""The daemon's control verb table (the control socket's handler): one request, one answer."""


class LogSource(Protocol):
    """The daemon's log lines (`dankserve.logsources.LogFeed`, handed in by the daemon's assembly): each
    line one JSON object with time, source, deployment and message."""

    def deployments(self) -> list[str]: ...

    def tail(
        self, deployment: str | None, lines: int
    ) -> tuple[list[str], Callable[[Callable[[str], None], threading.Event], None]]: ...


LOG_HISTORY_LINES = 200
LOG_QUEUE_LINES = 2000
"""Lines a slow page may fall behind before the oldest unsent are dropped (a drop is said on the page)."""
LOG_KEEPALIVE_SECONDS = 15.0

ACTIONS = frozenset({"sleep", "wake", "restart", "reload", "upgrade", "rollback"})
"""What the page may ask; `reload` takes no deployment."""
MAX_ACTION_BYTES = 4096
STATUS_SECONDS = 1.9
"""Open pages share one status document (asked once, encoded once) this long: just under the page's 2 s poll, so
five pages cost the daemon what one does and each still sees a document no older than its poll."""
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
STATIC = {
    "console.js": "text/javascript",
    "console.css": "text/css",
    "icon.svg": "image/svg+xml",
    "index.html": "text/html",
}


def _asset(name: str) -> bytes:
    return resources.files("dankserve.gateway.console").joinpath("static", name).read_bytes()


def _headers() -> dict[str, str]:
    return {
        "Content-Security-Policy": CSP,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-store",
    }


def _refused(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status, headers=_headers())


class Console:
    """The console's handlers over the gateway's `Access` and the daemon's `Control`."""

    def __init__(
        self,
        access: Access,
        control: Control,
        clock: Callable[[], float] = time.monotonic,
        logs: LogSource | None = None,
    ) -> None:
        self._access = access
        self._control = control
        self._logs = logs
        self._clock = clock
        self._status_cache: tuple[float, Mapping[str, Any], bytes] | None = None
        self._status_lock = asyncio.Lock()
        self._followers: set[asyncio.Queue[bytes]] = set()
        self._pusher: asyncio.Task[None] | None = None
        self._poke = asyncio.Event()
        self._assets = {name: _asset(name) for name in STATIC}  # read once: the package does not change

    def mount(self, app: web.Application) -> None:
        app.router.add_get("/ui", self._to_page)
        app.router.add_get("/ui/", self._page)
        app.router.add_get("/ui/static/{name}", self._static)
        app.router.add_get("/ui/api/status", self._guarded(CONSOLE, self._status))
        app.router.add_get("/ui/api/status/events", self._guarded(CONSOLE, self._follow_status))
        app.router.add_get("/ui/api/usage", self._guarded(CONSOLE, self._usage))
        app.router.add_get("/ui/api/requests", self._guarded(CONSOLE, self._requests))
        app.router.add_get("/ui/api/logs", self._guarded(CONSOLE, self._stream_logs))
        app.router.add_post("/ui/api/action", self._guarded(CONSOLE_ADMIN, self._action))
        app.router.add_get("/running", self._guarded(CONSOLE, self._running))
        app.router.add_post("/unload", self._guarded(CONSOLE_ADMIN, self._unload))

    def _allowed(self, request: web.Request, scope: str) -> Verdict | None:
        if not self._access.ring().required:
            return keyless(request.remote, action=scope == CONSOLE_ADMIN)
        key = self._access.identify(request.headers.getall("Authorization", []), scope)
        return Verdict(key.status, key.message) if isinstance(key, Denied) else None

    def _guarded(
        self, scope: str, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def guarded(request: web.Request) -> web.StreamResponse:
            verdict = self._allowed(request, scope)
            if verdict is not None:
                return _refused(verdict.status, verdict.message)
            return await handler(request)

        return guarded

    async def _to_page(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("/ui/")

    async def _page(self, request: web.Request) -> web.Response:
        verdict = self._allowed(request, CONSOLE) if not self._access.ring().required else None
        if verdict is not None:  # keyless and not loopback: not even the empty page
            return _refused(verdict.status, verdict.message)
        return web.Response(body=self._assets["index.html"], content_type="text/html", headers=_headers())

    async def _static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC or name == "index.html":
            return _refused(404, f"no console asset {name[:80]!r}")
        return web.Response(body=self._assets[name], content_type=STATIC[name], headers=_headers())

    async def _ask(self, command: Mapping[str, Any]) -> Mapping[str, Any]:
        return await asyncio.get_running_loop().run_in_executor(None, self._control, command)

    async def _read_status(self) -> tuple[Mapping[str, Any], bytes]:
        """The daemon's status answer and its document as JSON, asked and encoded at most once per STATUS_SECONDS
        whoever polls."""
        async with self._status_lock:
            cached = self._status_cache
            if cached is not None and self._clock() - cached[0] < STATUS_SECONDS:
                return cached[1], cached[2]
            answer = await self._ask({"command": "status"})
            body = json.dumps(answer["status"]).encode() if answer.get("ok") else b""
            self._status_cache = (self._clock(), answer, body) if answer.get("ok") else None
            return answer, body

    async def _status(self, request: web.Request) -> web.Response:
        answer, body = await self._read_status()
        if not answer.get("ok"):
            return _refused(503, str(answer.get("error", "the daemon did not answer")))
        return web.Response(body=body, content_type="application/json", headers=_headers())

    async def _follow_status(self, request: web.Request) -> web.StreamResponse:
        """The status document as server-sent events: one reading of the daemon and one encoding, per
        STATUS_SECONDS, written to every page that follows it (a page costs a write, not a request)."""
        queue: asyncio.Queue[bytes] = asyncio.Queue(1)  # a page that reads slowly gets the newest document only
        self._followers.add(queue)
        if self._pusher is None or self._pusher.done():
            self._pusher = asyncio.create_task(self._push_status())
        else:
            self._poke.set()  # a page opened now sees the document now
        response = web.StreamResponse(headers={**_headers(), "Content-Type": "text/event-stream"})
        try:
            await response.prepare(request)
            while True:
                await response.write(b"data: " + await queue.get() + b"\n\n")
        finally:
            self._followers.discard(queue)

    async def _push_status(self) -> None:
        """While a page follows the status: read it (shared with the polls) and hand the same bytes to each."""
        while self._followers:
            self._poke.clear()
            answer, body = await self._read_status()
            if not answer.get("ok"):
                message = str(answer.get("error", "the daemon did not answer"))
                body = json.dumps({"error": {"message": message, "code": 503}}).encode()
            for queue in list(self._followers):
                if queue.full():
                    queue.get_nowait()
                queue.put_nowait(body)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poke.wait(), STATUS_SECONDS + 0.1)

    def _shows_key_names(self, request: web.Request) -> bool:
        """Whether the viewer holds `console:admin`: others see every key's name folded into one (as /metrics
        without its key shows them), not who uses the box how much."""
        return not isinstance(self._access.identify(request.headers.getall("Authorization", []), CONSOLE_ADMIN), Denied)

    async def _usage(self, request: web.Request) -> web.Response:
        totals = self._access.totals()
        rows = usage_rows(totals if self._shows_key_names(request) else hide_key_names(totals))
        return _unless_unchanged(request, {"rows": rows})

    async def _requests(self, request: web.Request) -> web.Response:
        entries = self._access.recent()
        shown = entries if self._shows_key_names(request) else hide_request_keys(entries)
        return _unless_unchanged(request, {"requests": [e.to_json() for e in shown], "kept": RECENT_REQUESTS})

    async def _stream_logs(self, request: web.Request) -> web.StreamResponse:
        """The last LOG_HISTORY_LINES lines, then each new one as it comes, as server-sent events (`data:` one
        JSON line); the readers stop when the page goes away."""
        logs = self._logs
        if logs is None:
            return _refused(404, "this console has no log source")
        loop = asyncio.get_running_loop()
        deployment = request.query.get("deployment") or None
        if deployment is not None and deployment not in await loop.run_in_executor(None, logs.deployments):
            return _refused(404, f"unknown deployment {deployment[:80]!r}")
        history, follow = await loop.run_in_executor(None, logs.tail, deployment, LOG_HISTORY_LINES)
        queue: asyncio.Queue[str] = asyncio.Queue(LOG_QUEUE_LINES)
        stop = threading.Event()

        def offer(line: str) -> None:
            if queue.full():  # a page that does not read fast enough loses the oldest unsent line
                queue.get_nowait()
            queue.put_nowait(line)

        def emit(line: str) -> None:
            if not stop.is_set():
                with contextlib.suppress(RuntimeError):  # the loop closed with the gateway
                    loop.call_soon_threadsafe(offer, line)

        response = web.StreamResponse(headers={**_headers(), "Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for line in history:
                await response.write(_event(line))
            follow(emit, stop)  # from where the history ended: nothing written in between is lost
            while True:
                try:
                    line = await asyncio.wait_for(queue.get(), LOG_KEEPALIVE_SECONDS)
                except TimeoutError:
                    await response.write(b": keep-alive\n\n")
                    continue
                await response.write(_event(line))
        finally:
            stop.set()

    async def _action(self, request: web.Request) -> web.Response:
        verdict = action_request(
            request.content_type, request.headers.get(ACTION_HEADER), request.headers.get("Origin"), request.host
        )
        if verdict is not None:
            return _refused(verdict.status, verdict.message)
        body = await request.content.read(MAX_ACTION_BYTES + 1)
        if len(body) > MAX_ACTION_BYTES:
            return _refused(413, f"an action's body is at most {MAX_ACTION_BYTES} bytes")
        try:
            document = json.loads(body)
        except ValueError:
            return _refused(400, "an action's body is a JSON object")
        command = _command(document)
        if isinstance(command, str):
            return _refused(400, command)
        answer = await self._ask(command)
        self._status_cache = None  # the next poll shows what the action did
        self._poke.set()  # and the pages that follow the status, at once
        return web.json_response(dict(answer), status=200 if answer.get("ok") else 409, headers=_headers())

    async def _running(self, request: web.Request) -> web.Response:
        answer, _ = await self._read_status()
        if not answer.get("ok"):
            return _refused(503, str(answer.get("error", "the daemon did not answer")))
        return web.json_response(running(answer["status"]), headers=_headers())

    async def _unload(self, request: web.Request) -> web.Response:
        answer = await self._ask({"command": "status"})
        if not answer.get("ok"):
            return _refused(503, str(answer.get("error", "the daemon did not answer")))
        errors = []
        for name in awake_members(answer["status"]):
            slept = await self._ask({"command": "sleep", "deployment": name})
            if not slept.get("ok"):
                errors.append(f"{name}: {slept.get('error')}")
        self._status_cache = None
        self._poke.set()
        if errors:
            return web.Response(status=409, text="; ".join(errors), headers=_headers())
        return web.Response(text="OK", headers=_headers())


def running(status: Mapping[str, Any]) -> dict[str, Any]:
    """llama-swap's `GET /running` over the `status --json` document: the deployments that serve now."""
    return {
        "running": [
            {"model": d["name"], "state": d["state"], "name": d["name"], "description": d.get("model") or ""}
            for d in status.get("deployments", [])
            if d.get("state") == "ready"
        ]
    }


def awake_members(status: Mapping[str, Any]) -> list[str]:
    """The swap-group members that do not sleep now (llama-swap's `/unload` puts them to sleep)."""
    return [
        d["name"]
        for d in status.get("deployments", [])
        if d.get("swap") is not None and d.get("state") not in ("asleep", "stopped", "failed", "down")
    ]


def _unless_unchanged(request: web.Request, document: Mapping[str, Any]) -> web.Response:
    """The document, or 304 when the page already holds it (its ETag: a hash of the JSON): a page polling a
    document that changes only with traffic is answered without a body."""
    body = json.dumps(document).encode()
    tag = '"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'
    headers = {**_headers(), "ETag": tag}
    if request.headers.get("If-None-Match") == tag:
        return web.Response(status=304, headers=headers)
    return web.Response(body=body, content_type="application/json", headers=headers)


def _event(line: str) -> bytes:
    """One server-sent event carrying one JSON line (JSON holds no raw newline: one `data:` line)."""
    return b"data: " + line.replace("\n", " ").encode() + b"\n\n"


def _command(document: Any) -> dict[str, Any] | str:
    """The control request an action's body asks for, or what is wrong with it."""
    if not isinstance(document, dict):
        return "an action's body is a JSON object"
    action = document.get("action")
    if action not in ACTIONS:
        return f"action must be one of {', '.join(sorted(ACTIONS))}, not {str(action)[:40]!r}"
    if action == "reload":
        return {"command": "reload"}
    deployment = document.get("deployment")
    if not isinstance(deployment, str) or not 0 < len(deployment) <= 200:
        return f"{action} needs a deployment's name"
    return {"command": action, "deployment": deployment}
