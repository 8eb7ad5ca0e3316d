"""Following a workload's log in a thread of its own, into its worker's inbox (the worker's only input
queue: log lines and events alike)."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any

from dankserve.runtime.base import Runtime
from dankserve.supervisor import machine as m
from dankserve.supervisor.worker import launching


@dataclass(frozen=True)
class Line:
    """A log line (None: the stream ended) of the follower numbered `follower`."""

    follower: int
    text: str | None


Inbox = queue.Queue[m.Event | Line]


class LogPump:
    """Follows a workload's log in a thread into the worker's inbox, then None when the stream ends
    (the workload exited, or the runtime went away: the machine asks the runtime which)."""

    def __init__(
        self,
        runtime: Runtime,
        workload_id: str,
        inbox: Inbox,
        *,
        number: int,
        name: str,
        logger: Any,
        skip: int = 0,
        server: int | None = None,
    ) -> None:
        self._runtime = runtime
        self._server = server
        self._workload_id = workload_id
        self._inbox = inbox
        self._number = number
        self._skip = skip
        self._log = logger
        threading.Thread(target=self._pump, name=f"logs-{name}", daemon=True).start()

    def _pump(self) -> None:
        seen = 0
        try:
            for line in launching.server_log(self._runtime.logs(self._workload_id, follow=True), self._server):
                seen += 1
                if seen > self._skip:  # a stream opened again replays the log from its start
                    self._inbox.put(Line(self._number, line))
        except Exception as exc:
            self._log.warning("log_stream_error", error=str(exc))
        finally:
            self._inbox.put(Line(self._number, None))
