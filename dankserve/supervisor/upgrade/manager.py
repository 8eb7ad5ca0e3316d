"""The daemon's upgrades: one at a time per deployment, each on a thread of its own, driven through
`upgrade_edge.DaemonUpgradeEdge`; `rollback`; and what a daemon following one killed mid-upgrade does.

Which image a deployment runs is `records.serving_image`: the configured one, unless an upgrade switched it
away (then the new one, until `rollback` or a configuration naming another image). It is kept in state.json
(the upgrade's record), never written into the running settings: a worker reads it through
`StateBook.as_run` at each plan."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace

import structlog

from dankserve.errors import DankserveError
from dankserve.runtime.base import PullPolicy
from dankserve.supervisor import machine as m
from dankserve.supervisor.upgrade import (
    Limits,
    RestoreOld,
    Step,
    UpgradeState,
    begin,
    recover,
)
from dankserve.supervisor.upgrade.actions import Action
from dankserve.supervisor.upgrade.driver import drive
from dankserve.supervisor.upgrade.edge import DaemonUpgradeEdge, UpgradeFleet

log = structlog.get_logger("dankserve.upgrade")

GATED = frozenset({Step.MAKING_ROOM, Step.BOOTING, Step.CHECKING, Step.SWITCHING, Step.ROLLING_BACK})
"""Steps in which the old server does not serve: the gateway queues the deployment's requests."""


class Upgrades:
    """Upgrades and rollbacks of the daemon's deployments."""

    def __init__(self, daemon: UpgradeFleet) -> None:
        self._daemon = daemon
        self._lock = threading.Lock()
        self._running: dict[str, UpgradeState] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._after_start: list[tuple[str, RestoreOld]] = []
        self._serve_after_start: list[str] = []
        """Switched deployments whose trial a killed daemon left before handing it over: made to serve."""

    def limits(self) -> Limits:
        up = self._daemon.settings.upgrade
        return Limits(kv_shrink_percent=up.kv_shrink_percent, decode_slowdown_percent=up.decode_slowdown_percent)

    # -- views -------------------------------------------------------------------------------------
    def current(self, name: str) -> UpgradeState | None:
        with self._lock:
            return self._running.get(name)

    def gated(self, name: str) -> UpgradeState | None:
        """The upgrade of `name` while its old server does not serve (None: it serves, or no upgrade)."""
        state = self.current(name)
        return state if state is not None and state.step in GATED else None

    def _record(self, state: UpgradeState) -> None:
        with self._lock:
            self._running[state.deployment] = state
        self._daemon.state.set_upgrade(state.deployment, state.to_record())

    # -- requests ----------------------------------------------------------------------------------
    def start(
        self, name: str, image: str | None, pull: PullPolicy = "missing", *, if_newer: bool = False
    ) -> str | None:
        """Begin an upgrade of `name` to `image` (None: the image it runs, per `pull`); why not, or None.

        `if_newer` (auto-update): only when the image's digest differs from the one the server runs."""
        daemon = self._daemon
        dep = daemon.state.as_run(name, daemon.settings.deployments[name])
        worker = daemon.fleet.snapshot().get(name)
        if worker is None or worker.machine.stage is not m.Stage.READY:
            now = worker.machine.status if worker is not None else "not running"
            return f"deployment {name!r} is {now}: only a serving deployment is upgraded"
        if dep.runtime != "podman":
            return f"deployment {name!r} runs as a {dep.runtime}: upgrades change container images (runtime = podman)"
        if dep.with_image_entrypoint(worker.machine.image_entrypoint).uses_launcher or dep.hosts:
            return f"deployment {name!r} runs a launcher or several hosts: upgrades try one server beside another"
        target = image or dep.image
        if image is None and not if_newer:
            pull = "always"
        with self._lock:
            if name in self._threads and self._threads[name].is_alive():
                return f"an upgrade of {name!r} is already under way"
            state, actions = begin(
                name,
                dep.image,
                target,
                time.time(),
                old_version=worker.machine.vllm_version,
                limits=self.limits(),
                old_digest=worker.machine.image_digest,
                if_newer=if_newer,
            )
            edge = DaemonUpgradeEdge(daemon, name, pull, hand_over=True)
            thread = threading.Thread(
                target=self._drive, args=(state, actions, edge), name=f"upgrade-{name}", daemon=True
            )
            self._threads[name] = thread
        thread.start()
        return None

    def _drive(self, state: UpgradeState, actions: Sequence[Action], edge: DaemonUpgradeEdge) -> None:
        try:
            end = drive(state, actions, edge, self._record)
        except Exception as exc:  # a bug or an unreachable runtime: undo, never leave the trial running
            log.exception("upgrade_crashed", deployment=state.deployment)
            current = self.current(state.deployment) or state
            end, more = recover(current.at(current.step, reason=f"internal error: {type(exc).__name__}: {exc}"))
            end = drive(end, more, edge, self._record)
        self._finish(end, edge.handed_over if end.step is Step.SWITCHED else None)

    def _finish(self, end: UpgradeState, handover: str | None) -> None:
        name = end.deployment
        log.info("upgrade_done", deployment=name, step=end.step.value, reason=end.reason)
        self._daemon.coordinator.release_upgrade(name)  # (restoring the old server released it already)
        if end.step is Step.SWITCHED:
            self._replan(name, handover)
        with self._lock:
            self._running.pop(name, None)

    def _replan(self, name: str, handover: str | None) -> None:
        """The worker serves the image the deployment now runs: adopts the trial server handed over, else boots."""
        daemon = self._daemon
        worker = daemon.fleet.snapshot().get(name)
        if worker is not None:
            worker.request_replan(daemon.settings.deployments[name], handover)
            if daemon.settings.deployments[name].swap_group is not None:
                daemon.coordinator.wake(name, by="upgrade")  # a member asleep stays asleep on a replan: it serves now

    def rollback(self, name: str) -> str | None:
        """Back to the image before the last switch (its learned bytes and compile cache are kept per
        version, so the boot is warm); why not, or None."""
        daemon = self._daemon
        record = daemon.state.deployment(name).upgrade
        if self.current(name) is not None:
            return f"an upgrade of {name!r} is under way: it rolls back by itself on a regression"
        if record is None or record.step != "switched":
            return f"deployment {name!r} has no switched upgrade to roll back"
        if record.old_image == record.new_image:
            return (
                f"the upgrade of {name!r} kept the reference {record.old_image} (a moving tag): what it named before "
                "is no longer reachable by it; set image to the previous release's tag or digest and reload"
            )
        log.info("upgrade_rollback", deployment=name, image=record.old_image, leaving=record.new_image)
        daemon.state.set_upgrade(name, replace(record, step="rolled_back", reason="rolled back by hand"))
        worker = daemon.fleet.snapshot().get(name)
        if worker is not None:  # the record rolled back: the worker plans the configured image again
            worker.request_replan(daemon.settings.deployments[name])
        return None

    # -- a daemon following one killed -------------------------------------------------------------
    def recover_before_workers(self) -> None:
        """Undo or finish upgrades an earlier daemon left under way, before any worker boots: the
        trial server goes first, so no two servers hold the GPU beyond the plan."""
        daemon = self._daemon
        for name in list(daemon.settings.deployments):
            record = daemon.state.deployment(name).upgrade
            if record is not None and record.step == "switched" and self._remove_left_trial(name):
                self._serve_after_start.append(name)
            if record is None or record.step in ("switched", "rolled_back", "refused"):
                continue
            state, actions = recover(UpgradeState.from_record(name, record, self.limits()))
            log.warning(
                "upgrade_recovering", deployment=name, step=record.step, actions=[type(a).__name__ for a in actions]
            )
            edge = DaemonUpgradeEdge(daemon, name)
            now = [a for a in actions if not isinstance(a, RestoreOld)]
            later = [a for a in actions if isinstance(a, RestoreOld)]
            try:
                state = drive(state, now, edge, self._record)
            except DankserveError as exc:  # Podman unreachable: the trial is looked for again next start
                log.error("upgrade_recovery_failed", deployment=name, error=exc.message)
                continue
            self._after_start.extend((name, a) for a in later)
        with self._lock:
            for name in [n for n, s in self._running.items() if s.done]:
                self._running.pop(name)

    def _remove_left_trial(self, name: str) -> bool:
        """A trial server a daemon killed between the switch and its worker's adoption left under the trial's
        name: removed before any boot (the worker boots the new image instead); whether there was one."""
        try:
            return DaemonUpgradeEdge(self._daemon, name).stop_trial(None)
        except DankserveError as exc:
            log.error("upgrade_recovery_failed", deployment=name, error=exc.message)
            return False

    def resume_after_workers(self) -> None:
        """The old servers a recovery gives back (a member found asleep is woken), each on a thread."""
        pending, self._after_start = self._after_start, []
        serve, self._serve_after_start = self._serve_after_start, []
        for name in serve:  # the switch's promise: it serves the new image (a member adopted asleep is woken)
            edge = DaemonUpgradeEdge(self._daemon, name)
            threading.Thread(target=edge.restore_old, args=(None,), name=f"upgrade-{name}", daemon=True).start()
        for name, action in pending:
            record = self._daemon.state.deployment(name).upgrade
            if record is None:
                continue
            state = UpgradeState.from_record(name, record, self.limits())
            edge = DaemonUpgradeEdge(self._daemon, name)
            with self._lock:
                self._running[name] = state
            thread = threading.Thread(target=self._restore, args=(state, edge, action), daemon=True)
            thread.start()

    def _restore(self, state: UpgradeState, edge: DaemonUpgradeEdge, action: RestoreOld) -> None:
        end = drive(state, (action,), edge, self._record)
        self._daemon.coordinator.release_upgrade(end.deployment)
        with self._lock:
            self._running.pop(end.deployment, None)
