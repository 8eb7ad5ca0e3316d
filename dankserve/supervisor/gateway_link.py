"""The daemon's side of the gateway's Supervisor protocol: each deployment's phase and address.

Reads only what the workers already publish (their machine state) and the settings; it decides
nothing. `wake`, `touched` and `released` go to the daemon's swap groups (a deployment outside
one that is booting or restarting gets ready on its own).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dankserve.gateway.backends import Availability, Backend
from dankserve.secret_files import read_key_now
from dankserve.supervisor.lifecycle import Phase

if TYPE_CHECKING:
    from dankserve.supervisor.daemon import Daemon


class DaemonSupervisor:
    """Implements gateway.backends.Supervisor over a running Daemon."""

    def __init__(self, daemon: Daemon) -> None:
        self._daemon = daemon
        self._keys: dict[Path, tuple[int, str | None]] = {}

    def backend(self, deployment: str) -> Backend:
        daemon = self._daemon
        dep = daemon.settings.deployments.get(deployment)
        if dep is None or not dep.enabled:
            return Backend(Availability.OFF, "", 0, message="not configured or not enabled")
        key = self._key(dep.api_key_file)
        worker = daemon.snapshot().get(deployment)
        if worker is None:
            why = "taken down (`dankserve up NAME` starts it)" if daemon.state.is_down(deployment) else "stopped"
            return Backend(Availability.OFF, dep.host, dep.port, key, why)
        machine = worker.machine
        phase, message = machine.phase, machine.message
        if phase is Phase.READY:
            return Backend(Availability.READY, dep.host, dep.port, key)
        refused = daemon.swap_groups.refused(deployment)
        if refused is not None:
            return Backend(Availability.OFF, dep.host, dep.port, key, refused)
        if phase is Phase.ASLEEP:
            return Backend(Availability.ASLEEP, dep.host, dep.port, key, "asleep")
        if phase in (Phase.FAILED, Phase.STOPPED):
            return Backend(Availability.OFF, dep.host, dep.port, key, message or phase.value)
        return Backend(Availability.PENDING, dep.host, dep.port, key, phase.value)

    def wake(self, deployment: str) -> None:
        self._daemon.swap_groups.wake(deployment)  # booting and restarting ones get ready by themselves

    def touched(self, deployment: str) -> None:
        self._daemon.swap_groups.touched(deployment)

    def released(self, deployment: str) -> None:
        self._daemon.swap_groups.released(deployment)

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
