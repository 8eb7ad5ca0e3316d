"""Reload requests and their answers: `dankserve reload` waits for the reload that reads the file after it
asked, SIGHUP only asks. The main loop reads the count asked before the file, so each request is answered
by a reload that saw the file as it was when the request came."""

from __future__ import annotations

import threading

from dankserve.supervisor.reloading import ReloadOutcome


class ReloadRequests:
    """Counts reloads asked and done; a waiter is answered by the first reload that began after it asked."""

    def __init__(self) -> None:
        self._done_cond = threading.Condition()
        self._asked = 0
        self._done = 0
        self._last: ReloadOutcome | None = None

    def ask(self) -> int:
        """A new request's number (the caller then has the reload run)."""
        with self._done_cond:
            self._asked += 1
            return self._asked

    def asked(self) -> int:
        """Requests asked so far: read before the file is, these are answered by the reload that reads it."""
        with self._done_cond:
            return self._asked

    def answered(self, asked: int, outcome: ReloadOutcome) -> None:
        with self._done_cond:
            self._done = max(self._done, asked)
            self._last = outcome
            self._done_cond.notify_all()

    def wait(self, mine: int, timeout: float) -> ReloadOutcome | None:
        """The outcome of the reload that answers request `mine` (None: not done in time)."""
        with self._done_cond:
            if not self._done_cond.wait_for(lambda: self._done >= mine, timeout):
                return None
            return self._last
