"""A swap group's bound on swaps per minute (`[gateway] max_swaps_per_minute`, issue 29), as the coordinator
keeps it: the swaps each group began within the last minute, the wanted members whose swap has begun
(counted once), and the members held back until the bound lets their swap begin. Not thread-safe: the
swap groups call it under their lock."""

from __future__ import annotations

import structlog

from dankserve.supervisor.fleet import swap
from dankserve.supervisor.fleet.swap import CannotFit, Swap, Wait

log = structlog.get_logger("dankserve.swap")


class SwapBound:
    """Counts each group's swaps and holds back the wakes beyond its bound."""

    def __init__(self) -> None:
        self._swaps: dict[str, tuple[float, ...]] = {}
        """Each group's swap starts within the last minute."""
        self._swapping_to: set[str] = set()
        """Wanted members whose swap has begun (counted once)."""
        self._held: dict[str, float] = {}
        """Wanted members held by their group's bound: when (monotonic) the next swap may begin."""

    def holds(self, group: str, name: str, decision: Swap | Wait | CannotFit, now: float, bound: int | None) -> bool:
        """Whether the bound holds this wake back; a swap that begins (others must sleep) is counted."""
        swaps = (isinstance(decision, Swap) and decision.sleep) or isinstance(decision, Wait)
        if not swaps or name in self._swapping_to:
            return False
        begun = swap.recent_swaps(self._swaps.get(group, ()), now)
        at = swap.next_swap_at(begun, now, bound)
        if at is not None:
            if name not in self._held:
                log.info("swap_held", deployment=name, swap_group=group, per_minute=bound, seconds=round(at - now, 1))
            self._held[name] = at
            return True
        self._held.pop(name, None)
        self._swaps[group] = (*begun, now)
        self._swapping_to.add(name)
        return False

    def forget(self, name: str) -> None:
        """`name` is no longer wanted: its swap is over or given up."""
        self._swapping_to.discard(name)
        self._held.pop(name, None)

    def held_until(self, name: str) -> float | None:
        """When (monotonic) the bound lets a wake of `name` begin (None: not held)."""
        return self._held.get(name)
