"""Podman's checkpoint and restore of a container through its REST API (issue 41, docs/snapshots.md).

podman-py has no call for them; libpod's routes (Podman 4.3): `POST /containers/{name}/checkpoint` with
`export` (the archive comes back as the response body: CRIU's images, the container's config, its
/dev/shm as `devshm-checkpoint.tar`), `leaveRunning`, `tcpEstablished`, `keep` (CRIU's log kept in the
container's userdata); `POST /containers/{name}/restore` in place (from the container's own images), or
with `import` (the archive as the body, `name` for the new container). A thin adapter: one function per
call, typed errors carrying Podman's answer and CRIU's first error line.

CRIU's own options (`--link-remap`, which vLLM's renamed POSIX semaphores need) are not API parameters:
runc reads them from the file the container's `org.criu.config` annotation names (`CRIU_CONFIG_ANNOTATION`,
set at creation).
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any

from dankserve.errors import EnvironmentUnusable
from dankserve.runtime.podman.session import PodmanSession

CRIU_CONFIG_ANNOTATION = "org.criu.config"
"""runc hands CRIU the configuration file this annotation names (Podman has no parameter for CRIU's options)."""
CRIU_CONFIG = "link-remap\n"
"""The options Podman's CRIU needs for vLLM: a POSIX semaphore deleted from its first name (glibc's sem_open)
cannot be dumped without `link-remap` ("Can't create link remap ... Use link-remap option")."""
CALL_TIMEOUT_S = 600.0
_CHUNK = 1 << 20
_ANSWER_BYTES = 64 * 1024
_LOG_FILE = re.compile(r"log file: (\S+?\.log)")
_WORK_PATH = re.compile(r"--work-path (\S+)")
"""A failed `runc checkpoint` is answered with its command line only: CRIU's log is in its work path."""


class PodmanCheckpointFailed(EnvironmentUnusable):
    """Podman refused or failed a checkpoint or restore: its answer, and CRIU's first error where it names
    its log."""

    def __init__(self, message: str, *, log: Path | None = None) -> None:
        super().__init__(message, fix="read CRIU's log it names; docs/snapshots.md, Podman")
        self.log = log


def checkpoint(session: PodmanSession, container: str, export_to: Path, *, leave_running: bool = False) -> int:
    """The container checkpointed (stopped, unless `leave_running`) and its archive written to `export_to`
    (a new file, 0600); its bytes. A failure to write the archive (disk full) is an OSError: the container is
    checkpointed all the same (Podman answers once CRIU is done)."""
    params = {"export": True, "tcpEstablished": True, "keep": True, "leaveRunning": leave_running}
    response = _post(session, f"/containers/{container}/checkpoint", params, stream=True, what="checkpoint")
    written = 0
    try:
        fd = os.open(export_to, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            for chunk in response.iter_content(_CHUNK):
                out.write(chunk)
                written += len(chunk)
            out.flush()
            os.fsync(out.fileno())
    finally:
        response.close()
    return written


def restore_in_place(session: PodmanSession, container: str) -> str:
    """The checkpointed container restored from its own images; its id."""
    params = {"tcpEstablished": True, "keep": True}
    return _restored_id(_post(session, f"/containers/{container}/restore", params, what="restore"))


def restore_import(session: PodmanSession, archive: Path, name: str) -> str:
    """A new container named `name` restored from an exported archive; its id."""
    params = {"import": True, "name": name, "tcpEstablished": True, "keep": True}
    with archive.open("rb") as body:
        response = _post(
            session,
            f"/containers/{name}/restore",
            params,
            data=body,
            headers={"Content-Type": "application/x-tar"},  # else the service reads the body as a form
            what="restore",
        )
    return _restored_id(response)


def _post(session: PodmanSession, path: str, params: dict[str, Any], *, what: str, **kwargs: Any) -> Any:
    """One POST, not retried (a checkpoint or a restore is not idempotent); a refusal is PodmanCheckpointFailed."""
    from podman.errors import APIError

    try:
        response = session.client.api.post(path, params=params, timeout=CALL_TIMEOUT_S, **kwargs)
    except APIError as exc:
        raise _failed(what, str(exc.explanation or exc)) from exc
    except OSError as exc:
        raise session.failure(what, exc) from exc
    if response.status_code >= 300:
        text = response.raw.read(_ANSWER_BYTES).decode(errors="replace") if kwargs.get("stream") else response.text
        response.close()
        raise _failed(what, _message(text[:_ANSWER_BYTES]))
    return response


def _message(text: str) -> str:
    import json

    with contextlib.suppress(ValueError, AttributeError):
        data = json.loads(text)
        return str(data.get("message") or data.get("cause") or text)
    return text.strip()


def _failed(what: str, message: str) -> PodmanCheckpointFailed:
    """Podman's answer, with CRIU's first error line from the log it names (the log is in the container's
    userdata, which goes with the container)."""
    found = _LOG_FILE.search(message)
    work = _WORK_PATH.search(message)
    named = "dump.log" if what == "checkpoint" else "restore.log"
    log = Path(found.group(1)) if found else Path(work.group(1)) / named if work else None
    detail = first_criu_error(log) if log is not None else None
    said = " ".join(message.split())[:600]
    return PodmanCheckpointFailed(f"Podman's {what} failed: {said}" + (f"; CRIU: {detail}" if detail else ""), log=log)


def first_criu_error(log: Path) -> str | None:
    """CRIU's first error line that says something (not the harmless RLIMIT_NOFILE one), read bounded."""
    try:
        with log.open("rb") as handle:
            text = handle.read(8 << 20).decode(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if "Error (" in line and "RLIMIT_NOFILE" not in line:
            return line.split("): ", 1)[-1].strip()[:300]
    return None


def _restored_id(response: Any) -> str:
    try:
        data = response.json()
        return str(data["Id"])
    except (ValueError, KeyError, TypeError) as exc:
        raise PodmanCheckpointFailed(f"Podman's restore answered without a container id: {exc}") from exc


def shared_shm(attrs: dict[str, Any], pid: int | None = None) -> bool:
    """The container shares the host's IPC namespace (ipc=host): Podman 4.3 would save the host's whole
    /dev/shm into the archive and unpack it back over the host's at restore. Podman 4.3.1's inspect says
    `shareable` for ipc=host as for a private namespace (it looks for the namespace's path), so the container's
    process (`pid`) is asked too: the same IPC namespace as this process's is the host's."""
    if str(((attrs.get("HostConfig") or {}).get("IpcMode")) or "") == "host":
        return True
    with contextlib.suppress(OSError):
        return pid is not None and os.stat(f"/proc/{pid}/ns/ipc").st_ino == os.stat("/proc/self/ns/ipc").st_ino
    return False


def criu_of(info: dict[str, Any]) -> str | None:
    """What `podman info` says of CRIU (newer Podman: host.criuEnabled and the like; 4.3 says nothing)."""
    host = info.get("host") or {}
    found = {k: v for k, v in host.items() if "criu" in str(k).lower()} if isinstance(host, dict) else {}
    return ", ".join(f"{k}={v}" for k, v in sorted(found.items())) or None
