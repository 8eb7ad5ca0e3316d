"""What Podman streams: a container's log lines (its k8s-file read here where it can be, else the
API's frames) and the exits of dankserve's containers as events."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import datetime
from typing import Any, cast

from dankserve.errors import DankserveError
from dankserve.runtime.base import LABEL_MANAGED, ExitEvent
from dankserve.runtime.logfile import follow_file, k8s_file_timed_lines
from dankserve.runtime.podman.k8s_log import local_k8s_log, local_k8s_path
from dankserve.runtime.podman.parsing import exit_event_from, split_lines
from dankserve.runtime.podman.session import PodmanSession


class LogStreams:
    """The log lines and exit events of one Podman service."""

    def __init__(self, session: PodmanSession) -> None:
        self._session = session

    def logs(self, workload_id: str, follow: bool = False) -> Iterator[str]:
        """The container's stdout and stderr as lines; following until it exits if asked."""
        for _, line in self.timed_logs(workload_id, follow):
            yield line

    def timed_logs(self, workload_id: str, follow: bool = False) -> Iterator[tuple[datetime | None, str]]:
        """The container's lines, each with the time conmon wrote it where its k8s-file log is read
        here (None through the API); following until it exits if asked.

        Following a running container of this host whose log is a k8s-file reads that file
        directly (local_k8s_log): Podman 4's follow stream polls it only every 250 ms, which
        would hold back every line, readiness included, by up to that.
        """
        if self._session.url.startswith("unix://"):
            attrs = self._session.container_attrs(workload_id)
            if attrs is not None and follow:
                local = local_k8s_log(attrs)
                if local is not None:
                    yield from local
                    return
            elif attrs is not None:
                # The same file as the follower reads, so both views cut lines alike.
                path = local_k8s_path(attrs)
                if path is not None:
                    yield from k8s_file_timed_lines(follow_file(path, False, lambda: False))
                    return
        for line in self._api_logs(workload_id, follow):
            yield None, line

    def _api_logs(self, workload_id: str, follow: bool) -> Iterator[str]:
        from podman.api import stream_frames
        from podman.errors import NotFound

        session = self._session
        client = session.stream_client if follow else session.client

        def open_stream() -> Any:
            try:
                response = client.api.get(
                    f"/containers/{workload_id}/logs",
                    params={"follow": follow, "stdout": True, "stderr": True},
                    stream=True,
                )
                response.raise_for_status()
            except NotFound:
                return None
            return response

        response = session.call(f"read the logs of {workload_id}", open_stream)
        if response is None:
            return
        try:
            yield from split_lines(cast(Iterator[bytes], stream_frames(response)))
        except OSError as exc:
            raise session.failure(f"read the logs of {workload_id}", exc) from exc
        finally:
            response.close()

    def events(self, since: float | None = None, until: float | None = None) -> Iterator[ExitEvent]:
        """Exits of dankserve's containers as they happen (from `since`, until `until` if given)."""
        filters = [f"label={LABEL_MANAGED}=true", "type=container", "event=died", "event=oom"]
        stream = self._session.stream_client.events(  # type: ignore[no-untyped-call]
            filters=filters,
            decode=True,
            since=int(since) if since is not None else None,
            until=math.ceil(until) if until is not None else None,
        )
        oom: set[str] = set()
        try:
            for event in stream:
                actor_id = str((event.get("Actor") or {}).get("ID") or event.get("id") or "")
                if (event.get("status") or event.get("Action")) == "oom":
                    oom.add(actor_id)
                    continue
                exit_event = exit_event_from(event, oom_seen=actor_id in oom)
                if exit_event is None:
                    continue
                oom.discard(actor_id)
                if not exit_event.oom_killed:
                    attrs = self._session.container_attrs(exit_event.workload_id)
                    if attrs is not None and (attrs.get("State") or {}).get("OOMKilled"):
                        exit_event = ExitEvent(
                            exit_event.workload_id, exit_event.deployment, exit_event.exit_code, True
                        )
                yield exit_event
        except DankserveError:
            raise
        except Exception as exc:
            from podman.errors import APIError

            if isinstance(exc, APIError | OSError):
                raise self._session.failure("follow events", exc) from exc
            raise
