"""The control socket's requests as one verb table: `status`, `reload`, `settings`, `up`, `down`, `restart`, `sleep`,
`wake`, `upgrade` and `rollback`, each answered by one function of the running daemon.

The daemon is read through `Answering`, what a request may ask of it; `answer` looks the verb up, and
an unknown verb or deployment is said, never raised."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol

from dankserve.settings import IMAGE_FIX, image_reference_problem
from dankserve.supervisor import machine as m
from dankserve.supervisor.probes import sleep_mode
from dankserve.supervisor.reloading import RELOAD_WAIT_SECONDS, ReloadOutcome

if TYPE_CHECKING:
    from dankserve.runtime.base import PullPolicy
    from dankserve.settings import Settings
    from dankserve.supervisor.fleet.coordinator import FleetCoordinator
    from dankserve.supervisor.worker.fleet import Fleet

Answer = dict[str, Any]


class UpgradeRequests(Protocol):
    """What `upgrade` and `rollback` ask of the daemon's upgrades (supervisor/upgrade/manager.py)."""

    def start(
        self, name: str, image: str | None, pull: PullPolicy = "missing", *, if_newer: bool = False
    ) -> str | None: ...

    def rollback(self, name: str) -> str | None: ...


class Answering(Protocol):
    """What the control requests ask of the running daemon."""

    @property
    def settings(self) -> Settings: ...

    def status(self) -> dict[str, Any]: ...

    def reload_and_wait(self, timeout: float) -> ReloadOutcome | None: ...

    def take_down(self, name: str) -> None: ...

    def bring_up(self, name: str) -> None: ...

    def restart(self, name: str) -> None: ...

    def swap_and_wait(self, verb: Literal["sleep", "wake"], name: str) -> Answer: ...

    @property
    def upgrades(self) -> UpgradeRequests: ...


def _status(daemon: Answering, request: Mapping[str, Any]) -> Answer:
    return {"ok": True, "status": daemon.status()}


def _reload(daemon: Answering, request: Mapping[str, Any]) -> Answer:
    outcome = daemon.reload_and_wait(RELOAD_WAIT_SECONDS)
    if outcome is None:
        return {"ok": False, "error": f"the reload did not finish within {RELOAD_WAIT_SECONDS:g} s"}
    return {"ok": True, "reload": outcome.to_json()}


def _settings(daemon: Answering, request: Mapping[str, Any]) -> Answer:
    return {"ok": True, "settings": daemon.settings.model_dump(mode="json")}


def _unknown_deployment(daemon: Answering, name: object) -> Answer | None:
    if isinstance(name, str) and name in daemon.settings.deployments:
        return None
    known = ", ".join(sorted(daemon.settings.deployments)) or "none"
    return {"ok": False, "error": f"unknown deployment {name!r} (configured: {known})"}


def _on_deployment(act: Callable[[Answering, str], None]) -> Callable[[Answering, Mapping[str, Any]], Answer]:
    """A verb on one configured deployment: `{"ok": true}` once `act` returned (an unknown one is said)."""

    def verb(daemon: Answering, request: Mapping[str, Any]) -> Answer:
        name = request.get("deployment")
        unknown = _unknown_deployment(daemon, name)
        if unknown is not None:
            return unknown
        act(daemon, str(name))
        return {"ok": True}

    return verb


def _swap(verb: Literal["sleep", "wake"]) -> Callable[[Answering, Mapping[str, Any]], Answer]:
    def swap(daemon: Answering, request: Mapping[str, Any]) -> Answer:
        """Answered once asleep or ready (or given up)."""
        name = request.get("deployment")
        unknown = _unknown_deployment(daemon, name)
        if unknown is not None:
            return unknown
        return daemon.swap_and_wait(verb, str(name))

    return swap


def _upgrade(daemon: Answering, request: Mapping[str, Any]) -> Answer:
    """Answered once the upgrade began (its steps show in `status`); or why it cannot."""
    name = request.get("deployment")
    unknown = _unknown_deployment(daemon, name)
    if unknown is not None:
        return unknown
    image = request.get("image")
    if image is not None:
        problem = image_reference_problem(image) if isinstance(image, str) else "is not text"
        if problem is not None:
            return {"ok": False, "error": f"image {str(image)[:200]!r} {problem}: {IMAGE_FIX}"}
    pull = request.get("pull", "missing")
    if pull not in ("missing", "always", "never"):
        return {"ok": False, "error": f"pull {pull!r} is not missing, always or never"}
    error = daemon.upgrades.start(str(name), image, pull, if_newer=request.get("if_newer") is True)
    return {"ok": False, "error": error} if error is not None else {"ok": True}


def _rollback(daemon: Answering, request: Mapping[str, Any]) -> Answer:
    """Answered once the worker was told to boot the previous image (follow it in `status`)."""
    name = request.get("deployment")
    unknown = _unknown_deployment(daemon, name)
    if unknown is not None:
        return unknown
    error = daemon.upgrades.rollback(str(name))
    return {"ok": False, "error": error} if error is not None else {"ok": True}


def sleep_or_wake(fleet: Fleet, coordinator: FleetCoordinator, verb: Literal["sleep", "wake"], name: str) -> Answer:
    """`dankserve sleep NAME` / `dankserve wake NAME` (the daemon's `swap_and_wait`), asked of the fleet
    coordinator like the gateway's wakes (an upgrade under way holds them): answered once asleep or ready (or
    given up)."""
    settings = fleet.settings
    if settings.deployments[name].swap_group is None:
        return {"ok": False, "error": f"deployment {name!r} is in no swap group: set swap_group to let it sleep"}
    worker = fleet.get(name)
    if worker is None:
        return {"ok": False, "error": f"deployment {name!r} is not running (`dankserve up {name}` starts it)"}
    if verb == "sleep":
        error = coordinator.sleep(name, "by hand (`dankserve sleep`)")
        goal, wait = m.Stage.ASLEEP, sleep_mode.SLEEP_TIMEOUT_SECONDS
    else:
        error = None
        coordinator.wake(name, by="cli")
        goal, wait = m.Stage.READY, settings.boot_timeout_seconds
    if error is not None:
        return {"ok": False, "error": error}
    answer: Answer | None = None

    def decided() -> bool:
        nonlocal answer
        state = worker.machine
        refused = coordinator.refused(name)
        if state.stage is goal:
            answer = {"ok": True, "status": fleet.view(name, worker).to_json()}
        elif refused is not None:
            answer = {"ok": False, "error": f"cannot wake {name!r}: {refused}"}
        elif state.stage in m.TERMINAL or (state.stage is m.Stage.BACKOFF and state.last_failure is not None):
            failure = state.last_failure.message if state.last_failure is not None else state.message
            answer = {"ok": False, "error": f"{name!r} is {state.status}: {failure or 'see the log'}"}
        return answer is not None

    if coordinator.wait_until(decided, wait) and answer is not None:
        return answer
    held = coordinator.upgrade_hold(name)
    why = f" (held: {held}'s upgrade is under way)" if held is not None else ""
    return {"ok": False, "error": f"{name!r} did not become {goal.value} within {wait:g} s{why}"}


VERBS: Mapping[str, Callable[[Answering, Mapping[str, Any]], Answer]] = {
    "status": _status,
    "reload": _reload,
    "settings": _settings,
    "up": _on_deployment(lambda daemon, name: daemon.bring_up(name)),
    # answered once the worker stopped (the CLI's `down` returns then)
    "down": _on_deployment(lambda daemon, name: daemon.take_down(name)),
    # answered once the old server stopped and the new one's boot began (the CLI follows it)
    "restart": _on_deployment(lambda daemon, name: daemon.restart(name)),
    "sleep": _swap("sleep"),
    "wake": _swap("wake"),
    "upgrade": _upgrade,
    "rollback": _rollback,
}


def answer(daemon: Answering, request: Mapping[str, Any]) -> Answer:
    """The answer to one control request."""
    command = request.get("command")
    verb = VERBS.get(command) if isinstance(command, str) else None
    if verb is None:
        return {"ok": False, "error": f"unknown command {command!r}"}
    return verb(daemon, request)
