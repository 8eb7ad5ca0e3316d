"""A reload's plan carried out (`carry_out`): the daemon's main thread runs each action of
`reload_plan.plan_reload`'s plan in its order, and answers what each deployment did. The edge of the
plan: it tells workers to stop, replan or keep their new settings, starts new ones, loads adapters
into a ready server (a refusal restarts it instead), and records an upgrade the file's image
replaced."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

import structlog

from dankserve.planning import backend_address
from dankserve.secret_files import read_key_now
from dankserve.settings import DeploymentSettings, Settings
from dankserve.supervisor.control.reload_plan import (
    DeploymentAction,
    ImageFromConfig,
    Keep,
    LoadAdapters,
    ReloadPlan,
    Restart,
    Start,
    Stop,
)
from dankserve.supervisor.records import StateBook
from dankserve.supervisor.reloading import AdaptersInPlace, ReloadOutcome
from dankserve.supervisor.worker import adapters

log = structlog.get_logger("dankserve")


class ReloadedWorker(Protocol):
    """What a reload asks of a deployment's worker."""

    def use_settings(self, dep: DeploymentSettings) -> None: ...

    def request_replan(self, dep: DeploymentSettings) -> None: ...


class ReloadedFleet(Protocol):
    """The daemon's workers (`worker.fleet.Fleet`)."""

    def snapshot(self) -> Mapping[str, Any]: ...

    def retire(self, worker: Any) -> None: ...


StartWorker = Callable[..., None]
"""start(name, dep, join_asleep=...): a new worker for the deployment."""


def carry_out(
    plan: ReloadPlan, now: float, settings: Settings, *, fleet: ReloadedFleet, state: StateBook, start: StartWorker
) -> ReloadOutcome:
    """Each action of an accepted reload's plan, in its order (`settings`: the accepted ones); what each
    deployment did."""
    for image in plan.images:
        _leave_upgrade(state, image)
    done: dict[type[Any], list[str]] = {Restart: [], Start: [], Stop: [], Keep: []}
    in_place: dict[str, AdaptersInPlace] = {}
    workers = fleet.snapshot()
    for planned in plan.actions:
        worker: ReloadedWorker | None = workers.get(planned.name)
        action: DeploymentAction = planned
        if isinstance(planned, LoadAdapters):
            if worker is not None and _load_adapters(planned, settings):
                worker.use_settings(planned.dep)  # only adapters changed: loaded and unloaded, the server kept
                in_place[planned.name] = AdaptersInPlace.of(tuple(planned.change.load), planned.change.unload)
                done[Keep].append(planned.name)
                continue
            action = Restart(planned.name, planned.dep)  # a load refused: the server restarts instead
        done[type(action)].append(action.name)
        if isinstance(action, Stop) and worker is not None:
            # Not waited for here: this thread sends WATCHDOG=1, and a stop may take stop_timeout_seconds.
            log.info("reload_stop", deployment=action.name)
            fleet.retire(worker)
        elif isinstance(action, Restart) and worker is not None:
            log.info("reload_replan", deployment=action.name)
            worker.request_replan(action.dep)
        elif isinstance(action, Start):
            log.info("reload_start", deployment=action.name, joins_asleep=action.join_asleep)
            start(action.name, action.dep, join_asleep=action.join_asleep)
        elif isinstance(action, Keep) and action.dep is not None and worker is not None:
            # Only what the swap coordinator reads changed (it reads the new settings): the server, awake or
            # asleep, stays as it is.
            log.info("reload_swap_settings", deployment=action.name, server="unchanged")
            worker.use_settings(action.dep)
    restart, started, stop, keep = (tuple(done[kind]) for kind in (Restart, Start, Stop, Keep))
    log.info("reload_accepted", restart=restart, start=started, stop=stop, keep=keep, applied=list(plan.applied))
    return ReloadOutcome(now, None, restart, started, stop, keep, plan.applied, plan.needs_restart, in_place)


def _leave_upgrade(state: StateBook, image: ImageFromConfig) -> None:
    """The file names another image than the one an upgrade switched the deployment to: the file wins, and the
    upgrade is recorded as left (a later file naming the old image again runs that one, not the upgrade's)."""
    log.warning("reload_image_from_config", deployment=image.name, image=image.configured, leaving=image.upgraded)
    record = state.deployment(image.name).upgrade
    if record is not None and record.step == "switched":
        reason = f"the configuration names image {image.configured}"
        state.set_upgrade(image.name, replace(record, step="rolled_back", reason=reason))


def _load_adapters(action: LoadAdapters, settings: Settings) -> bool:
    """A reload's adapter changes loaded into and unloaded from the ready server; False: restart it instead."""
    dep, change = action.dep, action.change

    def paths() -> dict[str, str]:
        return adapters.server_paths_for(settings.hf_cache_dir, action.name, dep, list(change.load))

    address = backend_address(settings, action.name, dep)
    return adapters.apply(address, read_key_now(dep.api_key_file), change, paths)
