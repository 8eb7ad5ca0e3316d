"""vLLM's sleep mode over HTTP to the server (swap groups, issue 16): the edge behind SleepServer and WakeServer.

The routes exist only with `VLLM_SERVER_DEV_MODE=1` and `--enable-sleep-mode` (../shared facts:
"Sleep mode"): `GET /is_sleeping`, `POST /sleep?level=1|2`, `POST /wake_up[?tags=...]`,
`POST /collective_rpc {"method": "reload_weights"}`, `POST /reset_prefix_cache`. A level-2
wake is staged: weights, reload_weights, kv_cache, then the prefix cache reset. Each function
answers the machine's event (never raises): the decisions stay in `machine` and `swap`.

Both answer shapes are read: 0.26-0.31 answer an empty 200; 0.32+ answer `/sleep` with
`{"status": "sleeping", "level": n}` and `/wake_up` with `{"status": "awake"|"sleeping", "tags": ...}`
(`sleep_answer_problem`); `/is_sleeping` stays the check either way.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

from dankserve.backend_address import BackendAddress, httpx_client
from dankserve.supervisor import machine as m

SLEEP_TIMEOUT_SECONDS = 300.0
"""The longest a sleep or a wake may take: level 1 copies the weights to pinned RAM (GBs/s)."""


class _Unsupported(Exception):
    """The server has no sleep mode (`/is_sleeping` answered 404)."""


class _Failed(Exception):
    """A sleep-mode route failed."""


def _client(address: BackendAddress, api_key: str | None, timeout: float) -> httpx.Client:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx_client(address, headers, timeout)


def _call(client: httpx.Client, method: str, path: str, **kwargs: object) -> httpx.Response:
    try:
        response = client.request(method, path, **kwargs)  # type: ignore[arg-type]
    except httpx.HTTPError as exc:
        raise _Failed(f"{method} {path}: {type(exc).__name__}: {exc}") from None
    if response.status_code == 404 and path == "/is_sleeping":
        raise _Unsupported("GET /is_sleeping answered 404: the server runs without sleep mode or dev mode")
    if response.status_code >= 400:
        raise _Failed(f"{method} {path} answered HTTP {response.status_code}: {response.text[:200]}")
    return response


MAX_ANSWER_BYTES = 4096
"""A sleep route's answer is a few dozen bytes: anything longer is not one (read as no answer)."""


def sleep_answer_problem(body: bytes, *, route: str, level: int | None = None, awake: bool | None = None) -> str | None:
    """What a 200 answer of `/sleep` or `/wake_up` contradicts (None: nothing; an empty or foreign body says nothing).

    `level`: the level asked of `/sleep`; `awake`: whether this `/wake_up` should leave the server fully awake
    (False for the first stage of a staged wake)."""
    if not body or len(body) > MAX_ANSWER_BYTES:
        return None
    try:
        document = json.loads(body)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    status = document.get("status")
    if route == "/sleep":
        if status is not None and status != "sleeping":
            return f"POST /sleep answered status {str(status)[:40]!r}, not 'sleeping'"
        answered = document.get("level")
        if level is not None and isinstance(answered, int) and answered != level:
            return f"POST /sleep?level={level} answered level {answered}"
        return None
    if awake is not None and status in ("awake", "sleeping") and (status == "awake") != awake:
        return f"POST /wake_up answered status {status!r}, not {'awake' if awake else 'sleeping'!r}"
    return None


def _checked(response: httpx.Response, route: str, *, level: int | None = None, awake: bool | None = None) -> None:
    problem = sleep_answer_problem(response.content, route=route, level=level, awake=awake)
    if problem is not None:
        raise _Failed(problem)


def _is_sleeping(client: httpx.Client) -> bool:
    try:
        return bool(_call(client, "GET", "/is_sleeping").json().get("is_sleeping"))
    except ValueError:
        raise _Failed("GET /is_sleeping did not answer JSON") from None


def is_sleeping(address: BackendAddress, api_key: str | None, timeout: float = 5.0) -> bool | None:
    """Whether the server sleeps: no sleep mode (404) is awake; None when it does not answer (still booting)."""
    try:
        with _client(address, api_key, timeout) as client:
            return _is_sleeping(client)
    except _Unsupported:
        return False
    except _Failed:
        return None


def sleep_server(
    address: BackendAddress, api_key: str | None, level: m.SleepLevel, timeout: float = SLEEP_TIMEOUT_SECONDS
) -> m.FellAsleep | m.SleepUnsupported | m.SleepFailed:
    """Put the server to sleep at level 1 or 2 (`stop` is the runtime's, not this module's)."""
    started = time.monotonic()
    try:
        with _client(address, api_key, timeout) as client:
            if not _is_sleeping(client):
                _checked(_call(client, "POST", "/sleep", params={"level": level}), "/sleep", level=int(level))
            if not _is_sleeping(client):
                raise _Failed(f"POST /sleep?level={level} answered, yet /is_sleeping says awake")
    except _Unsupported as exc:
        return m.SleepUnsupported(str(exc))
    except _Failed as exc:
        return m.SleepFailed(str(exc))
    return m.FellAsleep(time.monotonic() - started)


def wake_server(
    address: BackendAddress, api_key: str | None, level: m.SleepLevel, timeout: float = SLEEP_TIMEOUT_SECONDS
) -> m.WokeUp | m.WakeFailed:
    """Wake the server; after level 2 the staged wake: weights, reload_weights, KV cache, prefix cache reset."""
    started = time.monotonic()
    try:
        with _client(address, api_key, timeout) as client:
            if level == "2":
                _checked(_call(client, "POST", "/wake_up", params={"tags": "weights"}), "/wake_up", awake=False)
                _call(client, "POST", "/collective_rpc", json={"method": "reload_weights"})
                _checked(_call(client, "POST", "/wake_up", params={"tags": "kv_cache"}), "/wake_up", awake=True)
                _call(client, "POST", "/reset_prefix_cache")
            else:
                _checked(_call(client, "POST", "/wake_up"), "/wake_up", awake=True)
            if _is_sleeping(client):
                raise _Failed("the wake answered, yet /is_sleeping still says asleep")
    except (_Unsupported, _Failed) as exc:
        return m.WakeFailed(str(exc))
    return m.WokeUp(time.monotonic() - started)


def available_ram_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """The host's MemAvailable (what level 1 may pin for the weights); None when unreadable."""
    try:
        for line in meminfo.read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
