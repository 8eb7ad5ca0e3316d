"""The daemon's view of the state store: the State in memory, shared by the worker threads.

Every change is applied to the in-memory State (pure `State.update`) under a lock and saved
at once. A save that fails (read-only or full disk) is logged once per distinct warning and
retried on the next change: the daemon keeps serving and loses no earlier state. Once a save
succeeds again the warnings are re-armed, so each spell of a read-only or full disk is reported.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from dankserve.bootlog import BootFacts
from dankserve.errors import EnvironmentUnusable
from dankserve.state import (
    CANARIES_KEPT,
    CANARY_TOKENS_KEPT,
    BootSummary,
    DeploymentState,
    FailureRecord,
    LearnedKv,
    State,
    StateStore,
    UnsafeSleep,
    UpgradeRecord,
)
from dankserve.supervisor.instance import check_private_dir
from dankserve.supervisor.observe.prediction import remembered

log = structlog.get_logger("dankserve")

if TYPE_CHECKING:
    from dankserve.settings import DeploymentSettings


def serving_image(configured: str, record: UpgradeRecord | None) -> str:
    """The image a deployment runs: an upgrade's new image once switched away from the configured one.

    A runtime fact of state.json, never written into the settings: a configuration that names another
    image than the one the upgrade left wins (the record's old image is no longer the configured one)."""
    if record is not None and record.step == "switched" and record.old_image == configured:
        return record.new_image
    return configured


class StateBook:
    """Thread-safe, write-through access to the persisted state.

    With `persist` (the daemon, `up`, `down`) a damaged file is moved aside and one a newer
    dankserve wrote is refused (EnvironmentUnusable, exit 3); without it (`status`) nothing on
    disk changes and `load_warnings` says what was found."""

    def __init__(self, state_dir: Path, *, persist: bool = True) -> None:
        if persist:  # it may move and write files there: only in a dir of this user's own
            check_private_dir(state_dir, "state_dir")
        self._store = StateStore(state_dir)
        self._lock = threading.Lock()
        self._persist = persist
        self._warned: set[str] = set()
        loaded = self._store.load(repair=persist)
        if loaded.newer is not None and persist:
            # Writing would destroy the newer release's state (its down flags, learned sizes).
            raise EnvironmentUnusable(
                f"state file {self._store.path} was {loaded.newer}",
                fix=f"run the newer dankserve, or move {self._store.path} aside to start afresh "
                "(learned KV sizes are learned again, `down` flags are lost)",
            )
        for warning in loaded.warnings:
            log.warning("state_warning", warning=warning)
        self._state: State = loaded.state
        self.load_warnings = loaded.warnings

    def _change(self, name: str, change: Callable[[DeploymentState], DeploymentState]) -> DeploymentState:
        with self._lock:
            self._state = self._state.update(name, change)
            current = self._state.deployment(name)
            state = self._state
        if self._persist:
            self._save(state)
        return current

    def _save(self, state: State) -> None:
        warnings = self._store.save(state)
        for warning in warnings:
            if warning not in self._warned:
                self._warned.add(warning)
                log.warning("state_not_saved", warning=warning)
        if not warnings and self._warned:
            # Saved again after failures: a later failure is worth a warning again.
            self._warned.clear()
            log.info("state_saved_again", path=str(self._store.path))

    def flush(self) -> None:
        """Save the current state (again)."""
        if self._persist:
            with self._lock:
                state = self._state
            self._save(state)

    # -- reads ---------------------------------------------------------------------------------
    def deployment(self, name: str) -> DeploymentState:
        with self._lock:
            return self._state.deployment(name)

    def as_run(self, name: str, dep: DeploymentSettings) -> DeploymentSettings:
        """The deployment as it runs: its configured settings with the image an upgrade switched it to."""
        image = serving_image(dep.image, self.deployment(name).upgrade)
        return dep if image == dep.image else dep.model_copy(update={"image": image})

    def learned(self, name: str, fingerprint: str) -> LearnedKv | None:
        return self.deployment(name).learned(fingerprint)

    def is_down(self, name: str) -> bool:
        return self.deployment(name).down

    # -- writes --------------------------------------------------------------------------------
    def next_boot(self, name: str) -> int:
        return self._change(name, lambda d: replace(d, boots=d.boots + 1)).boots

    def record_restart(self, name: str) -> None:
        self._change(name, lambda d: replace(d, restarts=d.restarts + 1))

    def record_failure(self, name: str, cause: str, message: str | None, at: float) -> None:
        self._change(name, lambda d: replace(d, last_failure=FailureRecord(cause, message, at)))

    def record_boot(
        self,
        name: str,
        facts: BootFacts,
        kv_bytes: int | None,
        learned_used: bool,
        *,
        adopted: bool = False,
        seconds: float | None = None,
        kind: str | None = None,
    ) -> None:
        """Remember a boot that turned ready (`seconds` it took, its `kind`); `adopted` (a server an earlier
        daemon left serving) keeps what that daemon saw of its boot: when it first turned ready (its uptime goes
        on), how long it took, and where its KV size came from (learned or profiled), unseen by this daemon."""
        earlier = self.deployment(name).last_boot
        kept = earlier if adopted and earlier is not None and earlier.ready else None
        summary = BootSummary(
            at=kept.at if kept is not None else time.time(),
            ready=facts.ready,
            vllm_version=facts.vllm_version,
            compile_cache_hit=facts.compile_cache_hit if kept is None else kept.compile_cache_hit,
            compile_seconds=facts.compile_seconds if kept is None else kept.compile_seconds,
            kv_cache_memory_bytes=kv_bytes,
            kv_cache_learned_used=learned_used if kept is None else kept.kv_cache_learned_used,
            seconds=seconds if kept is None else kept.seconds,
            kind=kind if kept is None else kept.kind,
        )
        self._change(name, lambda d: replace(d, last_boot=summary))

    def record_timing(self, name: str, kind: str, seconds: float) -> None:
        """Remember how long a boot, wake or sleep took (the predictions' history)."""
        self._change(name, lambda d: replace(d, timings=remembered(d.timings, kind, seconds)))

    def remember_learned(self, name: str, fingerprint: str, learned: LearnedKv) -> None:
        self._change(name, lambda d: d.remember(fingerprint, learned))

    def forget_learned(self, name: str, fingerprint: str) -> None:
        self._change(name, lambda d: d.forget(fingerprint))

    def set_down(self, name: str, down: bool) -> None:
        self._change(name, lambda d: replace(d, down=down))

    def set_asleep(self, name: str, level: str | None, moving: str | None = None) -> None:
        kept = self.deployment(name)
        if (kept.asleep, kept.swapping) != (level, moving):
            self._change(name, lambda d: replace(d, asleep=level, swapping=moving))

    def set_upgrade(self, name: str, upgrade: UpgradeRecord | None) -> None:
        self._change(name, lambda d: replace(d, upgrade=upgrade))

    def set_remediation(self, name: str, overrides: dict[str, int | float | str], remediated: tuple[str, ...]) -> None:
        self._change(name, lambda d: replace(d, overrides=overrides, remediated=remediated))

    def mark_sleep_unsafe(self, name: str, unsafe: UnsafeSleep) -> None:
        """Remember a level that failed its check (one record per level, version and model: the latest)."""

        def change(d: DeploymentState) -> DeploymentState:
            kept = tuple(
                u
                for u in d.unsafe_sleep
                if (u.level, u.vllm_version, u.model) != (unsafe.level, unsafe.vllm_version, unsafe.model)
            )
            return replace(d, unsafe_sleep=(*kept, unsafe))

        self._change(name, change)

    def remember_canary(self, name: str, key: str, ids: tuple[int, ...]) -> None:
        """The canary's token ids for a configuration (the first kept; the oldest configurations go first)."""

        def change(d: DeploymentState) -> DeploymentState:
            if key in d.canaries:
                return d
            kept = list(d.canaries.items())[-(CANARIES_KEPT - 1) :]
            return replace(d, canaries={**dict(kept), key: ids[:CANARY_TOKENS_KEPT]})

        self._change(name, change)
