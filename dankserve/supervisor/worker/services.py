"""What a deployment's worker needs of the rest of the daemon, and no more: `WorkerServices`.

A worker runs its machine's commands through the daemon's `World` (the runtimes, the planner, the
state store, the clock, the loopback edges: built once by `assembly.py`) and the daemon's shared
collaborators (the GPUs' boot slots, telemetry, the observatory, the fleet coordinator's boot
admission), and tells the daemon two things back (a phase changed, a stop failed). It never sees the
daemon itself: tests build a worker from a world of fakes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from dankserve.supervisor.world import World

if TYPE_CHECKING:
    import threading

    from dankserve.supervisor.fleet.gpus import HostGpus
    from dankserve.supervisor.fleet.swap_roster import PlanFacts
    from dankserve.supervisor.fleet.swap_verify import SwapVerifier
    from dankserve.supervisor.observe.telemetry import Telemetry
    from dankserve.supervisor.probes.observatory import Observatory


class BootAdmission(Protocol):
    """What a worker asks of the fleet coordinator (`FleetCoordinator`): may it boot now, and what its plan says."""

    def admit_boot(
        self, name: str, uuids: tuple[str, ...], cancelled: threading.Event, waits: Callable[[str], None]
    ) -> bool: ...

    def record_plan(self, name: str, facts: PlanFacts) -> None: ...


@dataclass(frozen=True)
class WorkerServices:
    """The world and the daemon's collaborators every worker of one daemon is handed."""

    world: World
    telemetry: Telemetry
    observatory: Observatory
    gpus: HostGpus
    swaps: BootAdmission
    phase_changed: Callable[[], None]
    """A worker's phase changed: the main loop and the fleet coordinator look again."""
    stop_failed: Callable[[str], None]
    """A worker could not stop its server (`run` exits 3 then)."""
    swap_verifier: SwapVerifier | None = None
    """Checks every sleep (NVML) and wake (the canary) of a swap group member (None: unchecked, in tests)."""
