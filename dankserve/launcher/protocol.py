"""What the daemon and the launcher say to each other, and how a server's lines are marked in the log.

The launcher listens on `SOCKET_NAME` in its run directory (a per-deployment directory of the
daemon's state dir, bind-mounted into the container). One request per connection: a JSON object
on one line, answered by one JSON object on one line, then the connection closes. Every answer
has `ok`; a refused request has `error` (a sentence). Operations:

- `status`: the launcher (`version`, `pid`, `import`: pending | done | failed, `import_seconds`,
  `import_threads`, `cuda_initialized`) and its current `server` (or null).
- `start` (`server_id`, `argv` after `vllm serve`, `env`, `env_files` {VAR: path read just
  before the start}, `fingerprint`): start a server; refused while one runs. Waits for the
  pre-import to finish when a fork is possible. Answers the server. The server's environment is
  the launcher's own without the variables named in `SPEC_ENV_VAR` (the image's, the CDI
  spec's and Podman's stay, as in a plain container), then `env`.
- `wait` (`timeout`): the server once it has exited, or `exited: false` after `timeout`.
- `stop` (`timeout`): SIGTERM to the server's process group, SIGKILL after `timeout`; answers
  the exited server.
- `shutdown`: stop the server, then the launcher exits.

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
