"""Reading what Podman answers (pure): inspect documents, events, pull reports, times, what
`vllm --version` printed, and which errors are transient."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any

from dankserve.runtime.base import (
    LABEL_DEPLOYMENT,
    ExitEvent,
    PullProgress,
    Workload,
    WorkloadState,
)

LABEL_VLLM_VERSION = "io.dankserve.vllm-version"
"""Image label naming the vLLM version the image holds; without it the image is run with --version."""
LABEL_PROBE = "io.dankserve.probe"
"""Marks the short-lived `vllm --version` containers (never LABEL_MANAGED: they are no workload)."""


def with_default_tag(image: str) -> str:
    """The reference with `:latest` added when it names neither a tag nor a digest."""
    last = image.rsplit("/", 1)[-1]
    return image if ":" in last or "@" in last else f"{image}:latest"


def pull_progress(reference: str, item: Mapping[str, Any]) -> PullProgress:
    """One report of Podman's (Docker-compatible) pull stream as a PullProgress."""
    detail = item.get("progressDetail") or {}
    current, total = detail.get("current"), detail.get("total")
    return PullProgress(
        reference=reference,
        status=str(item.get("status") or item.get("stream") or "").strip(),
        current_bytes=int(current) if isinstance(current, int) else None,
        total_bytes=int(total) if isinstance(total, int) and total > 0 else None,
        layer=str(item["id"]) if item.get("id") else None,
    )


def pull_error(item: Mapping[str, Any]) -> str | None:
    """The error a pull stream item reports (the HTTP status stays 200 on a failed pull)."""
    error = item.get("error") or (item.get("errorDetail") or {}).get("message")
    return str(error) if error else None


_VERSION_LINE = re.compile(r"^\s*v?(\d+\.\d+(?:\.\d+)?(?:[.+-][0-9A-Za-z.+-]+)?)\s*$")


def parse_vllm_version(output: str) -> str | None:
    """The version `vllm --version` printed: its last line that is a bare version number."""
    for line in reversed(output.splitlines()):
        match = _VERSION_LINE.match(line)
        if match:
            return match.group(1)
    return None


def split_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Log frames re-split into lines (a frame may hold several lines or part of one)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.decode("utf-8", "replace").rstrip("\r")
    if pending:
        yield pending.decode("utf-8", "replace").rstrip("\r")


_STATES: dict[str, WorkloadState] = {
    "configured": "created",
    "created": "created",
    "initialized": "created",
    "running": "running",
    "paused": "paused",
    "exited": "exited",
    "stopped": "stopped",
    "stopping": "stopped",
}


def parse_podman_time(value: str | None) -> float | None:
    """Unix time of a Go timestamp from `podman inspect`; None for Go's zero time."""
    if not value or value.startswith("0001-01-01"):
        return None
    # Go prints nanoseconds; Python takes at most microseconds.
    text = re.sub(r"(\.\d{6})\d+", r"\1", value.replace("Z", "+00:00"))
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def workload_from_inspect(attrs: Mapping[str, Any]) -> Workload:
    """A Workload from the libpod inspect document of a container."""
    state = attrs.get("State") or {}
    config = attrs.get("Config") or {}
    labels = dict(config.get("Labels") or {})
    status = str(state.get("Status") or "").lower()
    workload_state = _STATES.get(status, "unknown")
    exit_code = state.get("ExitCode")
    return Workload(
        id=str(attrs["Id"]),
        name=str(attrs.get("Name") or "").lstrip("/"),
        deployment=labels.get(LABEL_DEPLOYMENT, ""),
        state=workload_state,
        labels=labels,
        image=str(attrs.get("ImageName") or config.get("Image") or ""),
        exit_code=int(exit_code) if workload_state in ("exited", "stopped") and exit_code is not None else None,
        oom_killed=bool(state.get("OOMKilled")),
        pid=int(state["Pid"]) if state.get("Pid") else None,
        started_at=parse_podman_time(state.get("StartedAt")),
    )


def exit_event_from(event: Mapping[str, Any], oom_seen: bool = False) -> ExitEvent | None:
    """The ExitEvent of a `died` container event; None for any other event."""
    if (event.get("status") or event.get("Action")) != "died":
        return None
    actor = event.get("Actor") or {}
    attributes = actor.get("Attributes") or {}
    code = attributes.get("containerExitCode")
    return ExitEvent(
        workload_id=str(actor.get("ID") or event.get("id") or ""),
        deployment=str(attributes.get(LABEL_DEPLOYMENT, "")),
        exit_code=int(code) if code is not None and str(code).lstrip("-").isdigit() else None,
        oom_killed=oom_seen,
    )


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: the connection failed or Podman answered 5xx. Never 4xx, never a timeout."""
    from podman.errors import APIError
    from requests.exceptions import Timeout

    if isinstance(exc, APIError):
        if exc.status_code is None:
            return not isinstance(exc.__cause__, Timeout)
        return bool(exc.status_code >= 500)
    return isinstance(exc, OSError) and not isinstance(exc, Timeout)
