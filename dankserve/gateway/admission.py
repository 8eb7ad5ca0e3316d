"""Admission once ready (pure): at most `cap` requests in flight per deployment at the gateway; the rest
wait in the deployment's one bounded queue (the same that holds requests while it boots or wakes),
the highest key priority first, then in arrival order. A request that finds the queue full takes the
place of the last in line of a lower priority (`displace`), which leaves it with a 503.

The cap defaults to the plan's `--max-num-seqs` (what vLLM runs at once; beyond it vLLM queues
internally, where no priority applies and a client's wait is invisible). No cap known: no limit.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field


@dataclass(order=True, frozen=True)
class Ticket:
    """A waiting request's place: lower sorts first (higher priority, then earlier)."""

    rank: tuple[int, int]
    deployment: str = field(compare=False)


@dataclass
class _Line:
    in_flight: int = 0
    waiting: list[Ticket] = field(default_factory=list)
    gone: set[Ticket] = field(default_factory=set)
    displaced: set[Ticket] = field(default_factory=set)
    """Tickets out of line for a higher priority, until their waiters see it (`displaced`) and `drop` them."""

    def head(self) -> Ticket | None:
        while self.waiting and self.waiting[0] in self.gone:
            self.gone.discard(heapq.heappop(self.waiting))
        return self.waiting[0] if self.waiting else None


class Admission:
    """Requests in flight and waiting per deployment."""

    def __init__(self) -> None:
        self._lines: dict[str, _Line] = {}
        self._order = itertools.count()

    def _line(self, deployment: str) -> _Line:
        return self._lines.setdefault(deployment, _Line())

    def enter(self, deployment: str, cap: int | None) -> bool:
        """Let a request in now when there is room and no one waits before it (counted until `leave`)."""
        line = self._line(deployment)
        if (cap is not None and line.in_flight >= cap) or line.head() is not None:
            return False
        line.in_flight += 1
        return True

    def queue(self, deployment: str, priority: int) -> Ticket:
        ticket = Ticket((-priority, next(self._order)), deployment)
        heapq.heappush(self._line(deployment).waiting, ticket)
        return ticket

    def take(self, ticket: Ticket, cap: int | None) -> bool:
        """Let the waiting `ticket` in when there is room and it is first in line."""
        line = self._line(ticket.deployment)
        if (cap is not None and line.in_flight >= cap) or line.head() != ticket:
            return False
        heapq.heappop(line.waiting)
        line.in_flight += 1
        return True

    def drop(self, ticket: Ticket) -> None:
        """A waiting request gave up (timeout, the client left, refused, displaced): it leaves the line."""
        line = self._line(ticket.deployment)
        line.displaced.discard(ticket)
        if ticket in line.waiting:
            line.gone.add(ticket)
            line.head()

    def displace(self, deployment: str, priority: int) -> Ticket | None:
        """A request of `priority` finds the line full: the last in line of a lower priority leaves it (its
        waiter is told by `displaced`); None when every one waiting has `priority` or more."""
        line = self._line(deployment)
        last = max((t for t in line.waiting if t not in line.gone), default=None)
        if last is None or -last.rank[0] >= priority:
            return None
        line.gone.add(last)
        line.displaced.add(last)
        line.head()
        return last

    def displaced(self, ticket: Ticket) -> bool:
        return ticket in self._line(ticket.deployment).displaced

    def leave(self, deployment: str) -> None:
        """A request let in ended."""
        line = self._line(deployment)
        line.in_flight = max(0, line.in_flight - 1)

    def in_flight(self, deployment: str) -> int:
        return self._line(deployment).in_flight

    def waiting(self, deployment: str) -> int:
        line = self._line(deployment)
        return len(line.waiting) - len(line.gone)
