"""What the daemon and the launcher say to each other, and how a server's lines are marked in the log.

The launcher listens on `SOCKET_NAME` in its run directory (a per-deployment directory of the
daemon's state dir, bind-mounted into the container). One request per connection: a JSON object
on one line, answered by one JSON object on one line, then the connection closes. Every answer
has `ok`; a refused request has `error` (a sentence). Operations:

- `status`: the launcher (`version`, `pid`, `import`: pending | done | failed, `import_seconds`,
  `import_threads`, `cuda_initialized`) and its current `server` (or null).
- `start` (`server_id`, `argv` after `vllm serve`, `env`, `env_files` {VAR: path under
  /run/secrets read just before the start}, `fingerprint`): start a server; refused while one runs. Waits for the
  pre-import to finish when a fork is possible. Answers the server. The server's environment is
  the launcher's own without the variables named in `SPEC_ENV_VAR` (the image's, the CDI
  spec's and Podman's stay, as in a plain container), then `env`.
- `wait` (`timeout`): the server once it has exited, or `exited: false` after `timeout`.
- `stop` (`timeout`): SIGTERM to the server's process group, SIGKILL after `timeout`; answers
  the exited server.
- `shutdown`: stop the server, then the launcher exits.

Only what the daemon sends is accepted (`request_problem`): the socket is 0600 and a peer must be
root or the launcher's own user; the request must arrive whole within READ_SECONDS; every field is
checked (a `timeout` is a finite number of seconds, `env_files` name only Podman secrets). A
refused request is answered with `ok: false` and changes nothing; the launcher and its server go on.

A server is {`id`, `pid`, `mode`: fork | plain, `mode_reason`, `fingerprint`, `exited`,
`exit_code` (negative: killed by that signal), `oom_killed`, `started_at` (Unix time)}.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable, Iterator
from typing import Any

VERSION = 2
"""What `status` says the launcher speaks; a daemon reuses only a launcher of its own version (one left
running by an older dankserve keeps its server until the next boot, which gets a new launcher).
2: a server inherits the launcher's own environment but the deployment's variables (`SPEC_ENV_VAR`)."""
SOCKET_NAME = "launcher.sock"
MAX_MESSAGE_BYTES = 1 << 20
"""A request or an answer larger than this is refused (argv and env are small)."""

SPEC_ENV_VAR = "DANKSERVE_LAUNCHER_SPEC_ENV"
"""Set by the runtime that starts the launcher: the names (comma-separated) of the variables it set
for the deployment, which each `start` request gives anew (so a reload can drop one), or `*` when
a request's `env` is the server's whole environment (the process runtime)."""

READ_SECONDS = 2.0
"""A request must arrive whole within this from accept (the daemon sends it at once): a slow drip is cut."""
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600.0
"""The longest `timeout` a `wait` or `stop` may ask for."""
SECRETS_DIR = "/run/secrets"
"""Where the only files `env_files` may name live: the container's Podman secrets (runtime/podman.py)."""
OPS = frozenset({"status", "start", "wait", "stop", "shutdown"})
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SECRET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")

PREFIX = "dankserve-launcher:"
_STARTED = re.compile(r"^dankserve-launcher: server (\d+) started\b")
_EXITED = re.compile(r"^dankserve-launcher: server (\d+) exited\b")


SUN_PATH_MAX = 107
"""Linux's limit on a Unix socket's path (108 bytes with the terminating NUL)."""


@contextlib.contextmanager
def socket_address(path: str) -> Iterator[str]:
    """An address for the socket at `path` that fits a Unix socket's 107 bytes: the path itself, or (a deep
    state or test directory) the same file reached through an open descriptor of its directory."""
    if len(os.fsencode(path)) <= SUN_PATH_MAX:
        yield path
        return
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{directory}/{os.path.basename(path)}"
    finally:
        os.close(directory)


def encode(message: dict[str, Any]) -> bytes:
    """One message as a JSON line."""
    return (json.dumps(message, separators=(",", ":")) + "\n").encode("utf-8")


def decode(line: bytes) -> dict[str, Any]:
    """A JSON line as a message; ValueError when it is not a JSON object."""
    value = json.loads(line.decode("utf-8"))
    if not isinstance(value, dict):
        raise ValueError("a message must be a JSON object")
    return value


def request_problem(request: dict[str, Any], secrets_dir: str = SECRETS_DIR) -> str | None:
    """Why a request is not one the daemon sends (None: it is): every field of the right type and range,
    no NUL byte in what becomes an argument or a variable, `env_files` only directly in `secrets_dir`."""
    op = request.get("op")
    if op not in OPS:
        return f"unknown op {op!r}"
    if op in ("wait", "stop"):
        timeout = request.get("timeout", 0.0)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            return f"timeout must be a number of seconds, not {type(timeout).__name__}"
        if not 0.0 <= timeout <= MAX_TIMEOUT_SECONDS:  # NaN fails both comparisons
            return f"timeout must be between 0 and {MAX_TIMEOUT_SECONDS:g} seconds, not {timeout!r}"
    if op == "start":
        return _start_problem(request, secrets_dir)
    return None


def _start_problem(request: dict[str, Any], secrets_dir: str) -> str | None:
    server_id = request.get("server_id")
    if isinstance(server_id, bool) or not isinstance(server_id, int) or server_id < 0:
        return "server_id must be a non-negative integer"
    argv = request.get("argv")
    if not isinstance(argv, list) or not all(isinstance(a, str) and "\x00" not in a for a in argv):
        return "argv must be a list of strings without NUL bytes"
    fingerprint = request.get("fingerprint")
    if fingerprint is not None and not isinstance(fingerprint, str):
        return "fingerprint must be a string"
    for key in ("env", "env_files"):
        table = request.get(key, {})
        if not isinstance(table, dict):
            return f"{key} must be an object of strings"
        for name, value in table.items():
            if not _VAR_NAME.fullmatch(name) or not isinstance(value, str) or "\x00" in value:
                return f"{key} holds {name!r}: names must be variable names and values strings without NUL bytes"
    for name, path in request.get("env_files", {}).items():
        directory, _, file = path.rpartition("/")
        if directory != secrets_dir or not _SECRET_NAME.fullmatch(file):
            return f"env_files.{name} = {path!r}: only a file directly under {secrets_dir} is read"
    return None


def started_line(server_id: int, mode: str, reason: str) -> str:
    """Written before the server exists, so that none of its lines can come first."""
    return f"{PREFIX} server {server_id} started: {mode} boot ({reason})"


def exited_line(server_id: int, exit_code: int | None, oom_killed: bool) -> str:
    how = "killed by the kernel's OOM killer" if oom_killed else f"exit code {exit_code}"
    return f"{PREFIX} server {server_id} exited: {how}"


def server_lines(lines: Iterable[str], server_id: int) -> Iterator[str]:
    """The lines of server `server_id` in a launcher's log: after its start marker, until its exit marker.

    The log holds every server this launcher started (and the launcher's own lines): a new
    server's boot must be read from its own first line, and its stream ends where it exited.
    """
    inside = False
    for line in lines:
        bare = line.rstrip("\r\n")
        started = _STARTED.match(bare)
        if started is not None:
            inside = int(started.group(1)) == server_id
            continue
        exited = _EXITED.match(bare)
        if exited is not None:
            if int(exited.group(1)) == server_id:
                return
            continue
        if inside and not bare.startswith(PREFIX):
            yield line
