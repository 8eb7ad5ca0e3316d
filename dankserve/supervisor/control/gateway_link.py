"""The daemon's side of the gateway's Supervisor protocol: each deployment's phase and address.

Reads only what the workers already publish (their machine state), the settings, the fleet coordinator's
draining and bound, and the boot and wake history (predicted ready seconds); it decides nothing.
`wake`, `touched` and `released` go to the daemon's fleet coordinator (a deployment outside one that is
booting or restarting gets ready on its own).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from dankserve.gateway.backends import Availability, Backend
from dankserve.planning import backend_address
from dankserve.secret_files import read_key_now
from dankserve.supervisor.fleet.swap_fit import wake_cost_seconds
from dankserve.supervisor.lifecycle import Phase
from dankserve.supervisor.observe import prediction

if TYPE_CHECKING:
    from dankserve.supervisor.fleet.coordinator import FleetCoordinator
    from dankserve.supervisor.upgrade import UpgradeState
    from dankserve.supervisor.worker.fleet import Fleet


class UpgradeGate(Protocol):
    """The daemon's upgrades (supervisor/upgrade/manager.py): a deployment whose old server does not serve."""

    def gated(self, name: str) -> UpgradeState | None: ...


class DaemonSupervisor:
    """Implements gateway.backends.Supervisor over a running daemon's fleet, its coordinator and upgrades
    (a deployment being upgraded queues its requests while its old server does not serve)."""

    def __init__(self, fleet: Fleet, swaps: FleetCoordinator, upgrades: UpgradeGate | None = None) -> None:
        self._fleet = fleet
        self._swaps = swaps
        self._upgrades = upgrades
        self._keys: dict[Path, tuple[int, str | None]] = {}

    def backend(self, deployment: str) -> Backend:
        backend = self._backend(deployment)
        worker = self._fleet.get(deployment)
        facts = worker.machine.facts if worker is not None else None
        if facts is None or not facts.max_model_len:
            return backend
        return replace(backend, max_model_len=facts.max_model_len)

    def _backend(self, deployment: str) -> Backend:
        fleet = self._fleet
        dep = fleet.settings.deployments.get(deployment)
        if dep is None or not dep.enabled:
            return Backend(Availability.OFF, None, message="not configured or not enabled", state="disabled")
        key = self._key(dep.api_key_file)
        address = backend_address(fleet.settings, deployment, dep)
        worker = fleet.get(deployment)
        if worker is None and fleet.restarting(deployment):  # `dankserve restart`: requests wait for the new boot
            boot = prediction.predict(fleet.state.deployment(deployment).timings).boot()
            why = "restarting (`dankserve restart`)"
            return Backend(Availability.PENDING, address, key, why, state="restarting", ready_in=boot)
        if worker is None:
            down = fleet.state.is_down(deployment)
            why = f"taken down (`dankserve up {deployment}` starts it)" if down else "stopped"
            state = "down" if down else "stopped"  # the words `dankserve status` uses
            return Backend(Availability.OFF, address, key, why, state=state)
        machine = worker.machine
        phase, message = machine.phase, machine.message
        swaps = self._swaps
        upgrading = self._upgrades.gated(deployment) if self._upgrades is not None else None
        if upgrading is not None:  # the old server makes room or the new one is tried: requests wait
            why = f"upgrading to {upgrading.new_image} ({upgrading.step.value.replace('_', ' ')})"
            return Backend(Availability.PENDING, address, key, why, state="upgrading")
        if phase is Phase.READY:
            for_whom = swaps.draining(deployment)
            if for_whom is None:
                cap = worker.max_num_seqs
                return Backend(Availability.READY, address, key, state=machine.status, ready_in=0.0, max_in_flight=cap)
            why = f"finishing its requests before a swap to {for_whom}"
            return Backend(Availability.PENDING, address, key, why, state="draining")
        refused = swaps.refused(deployment)
        if refused is not None:
            return Backend(Availability.OFF, address, key, refused, state=machine.status)
        record = fleet.state.deployment(deployment)
        predicted = prediction.predict(record.timings)
        # A member asleep by `stop` wakes by booting: its boots predict it, not the sleep-mode wakes it may also
        # have had (0.2 s against 27 s).
        wake_seconds = wake_cost_seconds(record, machine.swap.level)
        now = fleet.clock.monotonic()
        if phase is Phase.ASLEEP:
            held = swaps.held_for(deployment)
            wake = None if wake_seconds is None else round(wake_seconds + (held or 0.0), 3)
            return Backend(Availability.ASLEEP, address, key, "asleep", state="asleep", ready_in=wake, held_for=held)
        if phase in (Phase.FAILED, Phase.STOPPED):
            return Backend(Availability.OFF, address, key, message or phase.value, state=machine.status)
        state = machine.status
        since = machine.swap.since if machine.swap.since is not None else now
        ready_in: float | None = None
        if phase is Phase.FALLING_ASLEEP:  # asleep first, then woken (once the swap it makes room for is done)
            left = prediction.remaining(predicted.sleep, now - since)
            ready_in = None if left is None or wake_seconds is None else round(left + wake_seconds, 3)
        elif state == "waking":
            ready_in = prediction.remaining(wake_seconds, now - since)
        else:
            began = machine.boot.started_at if machine.boot is not None else worker.phase_since
            ready_in = prediction.remaining(predicted.boot(), now - began)
        return Backend(Availability.PENDING, address, key, phase.value, state=state, ready_in=ready_in)

    def wake(self, deployment: str) -> None:
        # The coordinator holds it while an upgrade is under way (the upgrade decides which server serves);
        # booting and restarting ones get ready by themselves.
        self._swaps.wake(deployment, by="gateway")

    def touched(self, deployment: str) -> None:
        self._swaps.touched(deployment)

    def released(self, deployment: str) -> None:
        self._swaps.released(deployment)

    def _key(self, path: Path | None) -> str | None:
        """The deployment's key, read again when its file changes (a rotated key reaches the next boot too)."""
        if path is None:
            return None
        try:
            changed = path.stat().st_mtime_ns
        except OSError:
            return None  # the server could not have started either: its boot reports it
        cached = self._keys.get(path)
        if cached is None or cached[0] != changed:
            cached = (changed, read_key_now(path))
            self._keys[path] = cached
        return cached[1]
