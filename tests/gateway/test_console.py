"""The web console at /ui/ on a real gateway: who may read, who may act, the page's headers and weight.

The daemon's side is the control verb table (`Control`), stood in here by a function over a status
document: the narrow seam the console reads through (the daemon wires `Daemon.handle_request`)."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from dankserve.aioserver import GuardedServer
from dankserve.gateway.console.guard import is_loopback
from dankserve.gateway.console.routes import STATIC, _asset
from dankserve.gateway.keys import KeyFileError, parse_key
from dankserve.gateway.service import start_gateway
from dankserve.logsources import DAEMON_LOG, LogFeed
from dankserve.settings import DeploymentSettings, GatewaySettings
from dankserve.testing.lifecycle import FakeRuntime
from tests.gateway.conftest import TableSupervisor
from tests.gateway.test_access import write_keys
from tests.harness.browser import CHROMIUM, Browser
from tests.harness.daemon import free_port

HOSTILE = "<script>alert(1)</script>"
READER, ADMIN, API = "sk-reader-0123456789abcdef", "sk-admin-0123456789abcdef", "sk-api-0123456789abcdef"


GIB = 2**30
SHAPE: dict[str, Any] = {
    "phase": "serving",
    "endpoint": "http://127.0.0.1:8001",
    "runtime": "podman",
    "image": "docker.io/vllm/vllm-openai:v0.11.0",
    "uptime_seconds": 5400.0,
    "boots": 3,
    "restarts": 1,
    "boots_by_kind": {"cold": 1, "warm": 2},
    "last_boot": {"kind": "warm", "seconds": 41.2},
    "predicted": {"warm_seconds": 40.0, "wake_seconds": 3.1},
    "kv_cache_source": "learned",
    "last_failure": {"class": "oom", "message": "CUDA out of memory; gpu_memory_utilization lowered", "at": 0},
    "gpus": [{"index": 0, "memory_used_bytes": 60 * GIB, "memory_total_bytes": 80 * GIB}],
    "gpu_memory_held_bytes": 30 * GIB,
}
"""Fields of a `status --json` deployment as the page reads them (the daemon's document has more)."""


class Daemon:
    """The control verbs as the console sees them: a status document, actions recorded."""

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []
        self.state = "ready"

    def __call__(self, request: Mapping[str, Any]) -> Mapping[str, Any]:
        self.asked.append(dict(request))
        if request["command"] == "status":
            deployment = {**SHAPE, "name": "a", "state": self.state, "model": HOSTILE, "swap": {"group": "g"}}
            solo = {**SHAPE, "name": "solo", "state": "ready", "model": "org/solo", "swap": None}
            return {"ok": True, "status": {"daemon": {"running": True}, "deployments": [deployment, solo]}}
        if request["command"] == "sleep" and request.get("deployment") == "a":
            self.state = "asleep"
            return {"ok": True, "state": "asleep"}
        return {"ok": False, "error": f"deployment {request.get('deployment')!r} is not configured"}


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Callable[..., tuple[str, Daemon]]]:
    servers: list[GuardedServer] = []

    def make(**settings: Any) -> tuple[str, Daemon]:
        daemon = Daemon()
        gateway_settings = GatewaySettings(listen=f"127.0.0.1:{free_port()}", **settings)
        deps = {"a": DeploymentSettings(model="org/tiny")}
        runtime = FakeRuntime()  # no server runs: the lines come from daemon.log in the state dir
        logs = LogFeed(tmp_path / "state", lambda: {"a": runtime, "solo": runtime})
        server, _ = start_gateway(gateway_settings, lambda: deps, TableSupervisor(), console=daemon, logs=logs)
        servers.append(server)
        host, port = server.address
        return f"http://{host}:{port}", daemon

    yield make
    for server in servers:
        server.close()


def call(
    url: str, path: str, *, key: str | None = None, body: Any = None, headers: Mapping[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    sent = {**(headers or {})}
    if key is not None:
        sent["Authorization"] = f"Bearer {key}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        sent.setdefault("Content-Type", "application/json")
        sent.setdefault("X-Dankserve-Console", "1")
    request = urllib.request.Request(url + path, data=data, headers=sent, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def keyed(console: Callable[..., tuple[str, Daemon]], tmp_path: Path) -> tuple[str, Daemon]:
    keys = write_keys(
        tmp_path / "keys",
        reader=f'key = "{READER}"\nscopes = ["console"]',
        admin=f'key = "{ADMIN}"\nscopes = ["console:admin", "api"]',
        api=f'key = "{API}"',
    )
    return console(keys_dir=keys)


def test_without_keys_loopback_reads_and_nobody_acts(console: Callable[..., tuple[str, Daemon]]) -> None:
    url, daemon = console()
    status, headers, page = call(url, "/ui/")
    assert status == 200 and b"/ui/static/console.js" in page
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert "unsafe-inline" not in headers["Content-Security-Policy"]
    status, _, body = call(url, "/ui/api/status")
    assert status == 200 and json.loads(body)["deployments"][0]["model"] == HOSTILE
    status, _, body = call(url, "/ui/api/action", body={"action": "sleep", "deployment": "a"})
    assert status == 403 and b"console:admin" in body
    assert [r["command"] for r in daemon.asked] == ["status"]


def test_scopes_decide_what_each_key_is_served(console: Callable[..., tuple[str, Daemon]], tmp_path: Path) -> None:
    url, _ = keyed(console, tmp_path)
    assert call(url, "/ui/api/status")[0] == 401
    assert call(url, "/ui/api/status", key="sk-wrong-0123456789abcdef")[0] == 401
    assert call(url, "/ui/api/status", key=API)[0] == 403  # a key file without scopes: the API only
    assert call(url, "/ui/api/usage", key=API)[0] == 403
    assert call(url, "/ui/api/status", key=READER)[0] == 200
    assert call(url, "/ui/api/usage", key=READER)[0] == 200
    status, _, body = call(url, "/ui/api/action", key=READER, body={"action": "sleep", "deployment": "a"})
    assert status == 403 and b"console:admin" in body
    assert call(url, "/v1/models", key=READER)[0] == 403  # a console-only key does not reach the models
    assert call(url, "/v1/models", key=API)[0] == 200
    status, _, body = call(url, "/ui/api/action", key=ADMIN, body={"action": "sleep", "deployment": "a"})
    assert status == 200 and json.loads(body) == {"ok": True, "state": "asleep"}
    assert json.loads(call(url, "/ui/api/status", key=READER)[2])["deployments"][0]["state"] == "asleep"
    status, _, body = call(url, "/ui/api/action", key=ADMIN, body={"action": "wake", "deployment": HOSTILE})
    assert status == 409 and json.loads(body)["ok"] is False  # the daemon's own answer, passed back


def test_actions_refuse_cross_site_shapes(console: Callable[..., tuple[str, Daemon]], tmp_path: Path) -> None:
    url, daemon = keyed(console, tmp_path)
    sleep = {"action": "sleep", "deployment": "a"}
    assert call(url, "/ui/api/action", key=ADMIN, body=sleep, headers={"X-Dankserve-Console": "0"})[0] == 403
    assert call(url, "/ui/api/action", key=ADMIN, body=sleep, headers={"Content-Type": "text/plain"})[0] == 415
    evil = {"Origin": "http://evil.example"}
    assert call(url, "/ui/api/action", key=ADMIN, body=sleep, headers=evil)[0] == 403
    assert call(url, "/ui/api/action", key=ADMIN, body={"action": "rm -rf", "deployment": "a"})[0] == 400
    assert call(url, "/ui/api/action", key=ADMIN, body=["sleep"])[0] == 400
    assert call(url, "/ui/api/action", key=ADMIN, body={"action": "sleep", "deployment": "x" * 5000})[0] == 413
    assert [r for r in daemon.asked if r["command"] != "status"] == []


def test_assets_are_served_and_nothing_else(console: Callable[..., tuple[str, Daemon]]) -> None:
    url, _ = console()
    for name in ("console.js", "console.css"):
        status, headers, body = call(url, f"/ui/static/{name}")
        assert status == 200 and body == _asset(name) and headers["X-Content-Type-Options"] == "nosniff"
    assert call(url, "/ui/static/..%2f..%2fkeys.py")[0] == 404
    assert call(url, "/ui/static/index.html")[0] == 404


def test_first_load_weighs_under_200_kb() -> None:
    assert sum(len(_asset(name)) for name in STATIC) < 200 * 1024


def test_the_page_puts_values_in_as_text_only() -> None:
    """Hostile names and messages cannot become markup: the script never parses HTML from data."""
    script = _asset("console.js").decode()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script
    assert b"<script>" not in _asset("index.html").replace(b'<script src="/ui/static/console.js" defer>', b"")


def test_the_assets_are_package_data() -> None:
    text = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert '"gateway/console/static/*"' in text


def test_loopback_peers() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback(None)
    assert not is_loopback("10.0.0.1") and not is_loopback("garbage")


def test_a_key_files_scopes_are_checked() -> None:
    def read(path: str) -> str:
        raise AssertionError(path)

    key = parse_key("k", f'key = "{READER}"\nscopes = ["console"]', read)
    assert key.may("console") and not key.may("api") and not key.may("console:admin")
    admin = parse_key("k", f'key = "{READER}"\nscopes = ["console:admin"]', read)
    assert admin.may("console") and admin.may("console:admin")
    assert parse_key("k", f'key = "{READER}"', read).scopes == ("api",)
    for bad in ('["root"]', "[]", '"console"', "[1]"):
        with pytest.raises(KeyFileError, match="scopes"):
            parse_key("k", f'key = "{READER}"\nscopes = {bad}', read)


def test_llama_swaps_running_and_unload(console: Callable[..., tuple[str, Daemon]], tmp_path: Path) -> None:
    url, daemon = keyed(console, tmp_path)
    assert call(url, "/running", key=API)[0] == 403
    status, _, body = call(url, "/running", key=READER)
    assert status == 200
    assert [(r["model"], r["state"]) for r in json.loads(body)["running"]] == [("a", "ready"), ("solo", "ready")]
    assert call(url, "/unload", key=READER, body={})[0] == 403
    status, _, body = call(url, "/unload", key=ADMIN, body={})
    assert (status, body) == (200, b"OK")
    assert {"command": "sleep", "deployment": "a"} in daemon.asked
    assert {"command": "sleep", "deployment": "solo"} not in daemon.asked  # in no swap group: it cannot sleep
    assert [r["model"] for r in json.loads(call(url, "/running", key=READER)[2])["running"]] == ["solo"]


needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make system-deps)")
SHOTS = os.environ.get("DANKSERVE_CONSOLE_SCREENSHOTS")
"""A folder to write each page's screenshot into (docs/console/ when refreshing the README's pictures)."""
STATE = "document.querySelector('[data-deployment=\"a\"] .state')?.textContent"


@pytest.mark.slow
@needs_chromium
def test_in_a_real_browser(console: Callable[..., tuple[str, Daemon]], tmp_path: Path) -> None:
    """Loads with no console error, follows a sleep without a reload, shows hostile text as text,
    and shows the refusal of an action by a key without `console:admin`."""
    url, daemon = keyed(console, tmp_path)

    async def drive() -> None:
        async with Browser() as browser:
            await browser.goto(url + "/ui/")
            await browser.evaluate(f"sessionStorage.setItem('dankserve-key', {json.dumps(READER)}); true")
            browser.errors.clear()  # the first load had no key yet: its data requests were refused
            await browser.goto(url + "/ui/")  # as a person's second visit in the tab: the key is kept
            assert await browser.until(STATE) == "ready"
            shown = await browser.evaluate("document.body.innerText")
            assert HOSTILE in shown  # the model's name, as characters
            assert await browser.evaluate("document.scripts.length") == 1  # only console.js
            if SHOTS:
                for page in ("deployments", "swap", "usage", "actions"):
                    await browser.evaluate(f"location.hash = '#{page}'; true")
                    await asyncio.sleep(0.3)
                    await browser.screenshot(Path(SHOTS) / f"{page}.png")
            await browser.evaluate("location.hash = '#deployments'; true")
            daemon.state = "asleep"  # what the daemon says after `dankserve sleep a`
            assert await browser.until(f"{STATE} === 'asleep' && {STATE}") == "asleep"
            await browser.evaluate(
                "location.hash = '#actions'; window.confirm = () => true;"
                "document.getElementById('action').value = 'wake';"
                "document.getElementById('action-form').requestSubmit(); true"
            )
            answer = await browser.until(
                "document.getElementById('answer').textContent.includes('HTTP') && "
                "document.getElementById('answer').textContent"
            )
            assert "HTTP 403" in answer and "console:admin" in answer
            assert not [r for r in daemon.asked if r["command"] == "wake"]
            # the refused action is logged by the browser as a failed resource; nothing else went wrong
            assert [e for e in browser.errors if "/ui/api/action" not in e] == []

    asyncio.run(drive())


def test_open_pages_share_one_status_document(console: Callable[..., tuple[str, Daemon]]) -> None:
    """Five pages polling at once ask the daemon once per STATUS_SECONDS, not five times."""
    url, daemon = console()
    for _ in range(5):
        assert call(url, "/ui/api/status")[0] == 200
    assert [r["command"] for r in daemon.asked] == ["status"]


def daemon_line(event: str, deployment: str | None = None) -> str:
    """One line as the background daemon writes daemon.log (structlog's JSON)."""
    at = datetime.now(UTC).isoformat()
    fields = {"timestamp": at, "event": event, "level": "info", **({"deployment": deployment} if deployment else {})}
    return json.dumps(fields) + "\n"


def append_log(tmp_path: Path, *lines: str) -> None:
    (tmp_path / "state").mkdir(exist_ok=True)
    with (tmp_path / "state" / DAEMON_LOG).open("a") as handle:
        handle.write("".join(lines))


def read_events(url: str, path: str, key: str, count: int) -> tuple[http.client.HTTPResponse, list[dict[str, Any]]]:
    """Open the SSE stream and read `count` line events from it (keep-alive comments skipped)."""
    split = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(split.hostname or "", split.port, timeout=10)
    connection.request("GET", path, headers={"Authorization": f"Bearer {key}"})
    response = connection.getresponse()
    assert response.status == 200, response.read()
    assert response.getheader("Content-Type", "").startswith("text/event-stream")
    return response, next_events(response, count)


def next_events(response: http.client.HTTPResponse, count: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while len(events) < count:
        raw = response.readline()
        assert raw, "the stream ended"
        if raw.startswith(b"data: "):
            events.append(json.loads(raw[6:]))
    return events


def test_logs_stream_history_then_each_new_line(console: Callable[..., tuple[str, Daemon]], tmp_path: Path) -> None:
    """The Logs page's stream: the lines so far, then a line written later, one deployment's only when asked."""
    append_log(tmp_path, daemon_line("booting", "a"), daemon_line("booting", "solo"), daemon_line("started"))
    url, _ = keyed(console, tmp_path)
    response, history = read_events(url, "/ui/api/logs", READER, 3)
    assert [(e["deployment"], e["message"].split()[1]) for e in history] == [
        ("a", "booting"),
        ("solo", "booting"),
        (None, "started"),
    ]
    assert {e["source"] for e in history} == {"dankserve"} and all(e["time"] for e in history)
    one, [only] = read_events(url, "/ui/api/logs?deployment=a", READER, 1)
    assert only["deployment"] == "a"
    append_log(tmp_path, daemon_line("ready", "solo"), daemon_line("ready", "a"))
    assert [e["deployment"] for e in next_events(response, 2)] == ["solo", "a"]
    assert [e["deployment"] for e in next_events(one, 1)] == ["a"]  # solo's line was not sent here
    response.close()
    one.close()


def test_logs_need_the_console_scope(console: Callable[..., tuple[str, Daemon]], tmp_path: Path) -> None:
    url, _ = keyed(console, tmp_path)
    assert call(url, "/ui/api/logs", key=API)[0] == 403
    assert call(url, "/ui/api/logs")[0] == 401
    status, _, body = call(url, "/ui/api/logs?deployment=nope", key=READER)
    assert status == 404 and b"nope" in body


@pytest.mark.slow
@needs_chromium
def test_logs_page_in_a_real_browser(console: Callable[..., tuple[str, Daemon]], tmp_path: Path) -> None:
    """A hostile log line shows as its characters, and a line written while the page is open appears
    without a reload."""
    append_log(tmp_path, daemon_line(HOSTILE, "a"))
    url, _ = keyed(console, tmp_path)
    lines = "Array.from(document.querySelectorAll('#logs-body li')).map((li) => li.textContent)"

    async def drive() -> None:
        async with Browser() as browser:
            await browser.goto(url + "/ui/")
            await browser.evaluate(f"sessionStorage.setItem('dankserve-key', {json.dumps(READER)}); true")
            browser.errors.clear()
            await browser.goto(url + "/ui/")  # the key is kept in the tab
            await browser.evaluate("location.hash = '#logs'; true")
            shown = await browser.until(f"{lines}.length >= 1 && {lines}")
            assert any(HOSTILE in line for line in shown)
            assert await browser.evaluate("document.scripts.length") == 1  # the line's <script> is text
            append_log(tmp_path, daemon_line("a new line arrives", "a"))
            after = await browser.until(f"{lines}.some((t) => t.includes('a new line arrives')) && {lines}")
            assert len(after) == 2
            assert await browser.evaluate("performance.getEntriesByType('navigation').length") == 1
            if SHOTS:
                await browser.screenshot(Path(SHOTS) / "logs.png")
            assert browser.errors == []

    asyncio.run(drive())


def test_open_pages_follow_one_pushed_status(console: Callable[..., tuple[str, Daemon]], tmp_path: Path) -> None:
    """Pages that follow /ui/api/status/events share each reading of the daemon (asked once for all), and an
    action's outcome is pushed at once, not at the next reading."""
    url, daemon = keyed(console, tmp_path)
    assert call(url, "/ui/api/status/events", key=API)[0] == 403
    first, [one] = read_events(url, "/ui/api/status/events", READER, 1)
    second, [two] = read_events(url, "/ui/api/status/events", READER, 1)
    assert one == two and one["deployments"][0]["state"] == "ready"
    assert [r["command"] for r in daemon.asked] == ["status"]
    assert call(url, "/ui/api/action", key=ADMIN, body={"action": "sleep", "deployment": "a"})[0] == 200
    for stream in (first, second):
        pushed = next_events(stream, 1)[0]
        while pushed["deployments"][0]["state"] != "asleep":  # a reading taken before the action may come first
            pushed = next_events(stream, 1)[0]
        stream.close()
    assert len([r for r in daemon.asked if r["command"] == "status"]) <= 3


@pytest.mark.slow
@needs_chromium
def test_a_hidden_page_asks_for_nothing(console: Callable[..., tuple[str, Daemon]], tmp_path: Path) -> None:
    """A tab in the background (document.visibilityState hidden) stops following the status: the daemon is
    asked nothing more until the tab is shown again."""
    url, daemon = keyed(console, tmp_path)
    visibility = (
        "Object.defineProperty(document, 'visibilityState', {value: '%s', configurable: true});"
        "document.dispatchEvent(new Event('visibilitychange')); true"
    )

    def asked() -> int:
        return len([r for r in daemon.asked if r["command"] == "status"])

    async def drive() -> None:
        async with Browser() as browser:
            await browser.goto(url + "/ui/")
            await browser.evaluate(f"sessionStorage.setItem('dankserve-key', {json.dumps(READER)}); true")
            await browser.goto(url + "/ui/")
            assert await browser.until(STATE) == "ready"
            await browser.evaluate(visibility % "hidden")
            await asyncio.sleep(1)  # a reading begun before the tab hid may still end
            before = asked()
            await asyncio.sleep(5)  # two and a half pushes' time
            assert asked() == before
            daemon.state = "asleep"
            await browser.evaluate(visibility % "visible")
            assert await browser.until(f"{STATE} === 'asleep' && {STATE}") == "asleep"
            assert asked() > before

    asyncio.run(drive())
