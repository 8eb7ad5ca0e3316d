"""The supervisor's own counts since the daemon started: boots by kind, restarts and failures
by cause, boot durations, compile-cache hits, liveness probes, preemption warnings.

One owner of these numbers: the daemon's /metrics (supervisor.observe.metrics) and `dankserve status`
both read `Telemetry.snapshot()`. Counters live in memory (Prometheus expects a counter to
restart from zero with the process); the lifetime totals status shows stay in state.json.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from dankserve.supervisor.observe.swap_history import SwapHistory
from dankserve.supervisor.policy import FailureCause

BOOT_KINDS: tuple[str, ...] = ("cold", "warm", "learned_bytes", "launcher", "wake", "restore")
"""How a boot went: `cold` (no compile cache, vLLM profiled memory), `warm` (a compile-cache hit),
`learned_bytes` (the learned KV size skipped profiling), `launcher` (the pre-imported launcher),
`wake` (woken from sleep), `restore` (a snapshot restored, issue 41)."""

BOOT_BUCKETS: tuple[float, ...] = (1, 2, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600, 1200, 1800)
SWAP_BUCKETS: tuple[float, ...] = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
"""Histogram bounds for a swap group member's sleep and wake in seconds (0.2 s level 1 to a stop and boot)."""
SWAP_DIRECTIONS: tuple[str, ...] = ("sleep", "wake")
"""Histogram bounds for boot durations in seconds (a stand-in boot to a 70B model's cold boot)."""

FAILURE_CAUSES: tuple[str, ...] = tuple(c.value for c in FailureCause)

OBSERVED_FIELDS: tuple[str, ...] = (
    "boots_by_kind",
    "restarts_by_cause",
    "last_boot",
    "compile_cache_hits",
    "compile_cache_misses",
    "liveness",
    "preemption_warning",
)
"""The keys `DeploymentTelemetry.status_json` adds to a status document, in order."""


def boot_kind(
    *,
    compile_cache_hit: bool | None,
    learned_bytes_used: bool,
    launcher: bool = False,
    wake: bool = False,
    restore: bool = False,
) -> str:
    """The kind of a boot that reached ready (the fastest thing it skipped names it)."""
    if restore:
        return "restore"
    if wake:
        return "wake"
    if launcher:
        return "launcher"
    if learned_bytes_used:
        return "learned_bytes"
    return "warm" if compile_cache_hit else "cold"


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts (Prometheus's `le` semantics), their sum and count."""

    buckets: tuple[float, ...] = BOOT_BUCKETS
    counts: tuple[int, ...] = (0,) * len(BOOT_BUCKETS)
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> Histogram:
        counts = tuple(c + 1 if value <= bound else c for c, bound in zip(self.counts, self.buckets, strict=True))
        return replace(self, counts=counts, total=self.total + value, count=self.count + 1)


@dataclass(frozen=True)
class DeploymentTelemetry:
    """One deployment's counts (zero for every kind and cause, so every series exists from the start)."""

    boots: Mapping[str, int] = field(default_factory=lambda: MappingProxyType(dict.fromkeys(BOOT_KINDS, 0)))
    restarts: Mapping[str, int] = field(default_factory=lambda: MappingProxyType(dict.fromkeys(FAILURE_CAUSES, 0)))
    failures: Mapping[str, int] = field(default_factory=lambda: MappingProxyType(dict.fromkeys(FAILURE_CAUSES, 0)))
    boot_seconds: Mapping[str, Histogram] = field(
        default_factory=lambda: MappingProxyType({kind: Histogram() for kind in BOOT_KINDS})
    )
    compile_cache_hits: int = 0
    compile_cache_misses: int = 0
    probes_ok: int = 0
    probes_failed: int = 0
    preemption_warnings: int = 0
    last_boot: dict[str, Any] | None = None
    """{"kind", "seconds"} of the last boot that reached ready."""
    preemption_warning: dict[str, Any] | None = None
    """The last preemption warning: {"at", "message", "new_preemptions"}."""
    liveness: dict[str, Any] | None = None
    """The last liveness check's outcome for status."""
    swap_seconds: Mapping[str, Histogram] = field(
        default_factory=lambda: MappingProxyType(
            {direction: Histogram(SWAP_BUCKETS, (0,) * len(SWAP_BUCKETS)) for direction in SWAP_DIRECTIONS}
        )
    )
    """Swap groups: how long each sleep and wake took."""
    slower_than_predicted: Mapping[str, int] = field(
        default_factory=lambda: MappingProxyType(dict.fromkeys(("cold", "warm", "wake"), 0))
    )
    """Boots (cold, warm) and wakes that took more than twice their prediction (supervisor.observe.prediction)."""
    swap_checks_failed: Mapping[str, int] = field(
        default_factory=lambda: MappingProxyType(dict.fromkeys(("sleep", "wake"), 0))
    )
    """Sleeps NVML showed still holding memory (`sleep`), wakes whose canary answered other tokens (`wake`)."""
    snapshots: Mapping[str, int] = field(default_factory=lambda: MappingProxyType(dict.fromkeys(SNAPSHOT_EVENTS, 0)))
    """Snapshots (issue 41): captures (ok, failed) and restores (restored, fallback: discarded, booted)."""
    snapshot_seconds: Mapping[str, float] = field(
        default_factory=lambda: MappingProxyType({"capture_outage": 0.0, "restore": 0.0})
    )
    """Seconds in all: the captures' outages and the restores (kill to serving excluded: the restore only)."""

    def status_json(self) -> dict[str, Any]:
        """What `status --json` shows of these numbers."""
        return {
            "boots_by_kind": {k: v for k, v in self.boots.items() if v},
            "restarts_by_cause": {k: v for k, v in self.restarts.items() if v},
            "last_boot": self.last_boot,
            "compile_cache_hits": self.compile_cache_hits,
            "compile_cache_misses": self.compile_cache_misses,
            "liveness": self.liveness,
            "preemption_warning": self.preemption_warning,
        }


SNAPSHOT_EVENTS: tuple[str, ...] = ("captured", "capture_failed", "restored", "restore_fallback")


def _bump(counts: Mapping[str, int], key: str) -> Mapping[str, int]:
    return MappingProxyType({**counts, key: counts.get(key, 0) + 1})


class Telemetry:
    """Thread-safe: workers and the observer record, /metrics and status read snapshots."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_name: dict[str, DeploymentTelemetry] = {}
        self.swaps = SwapHistory()
        """The recent sleeps and wakes with their checks (status' `swaps`; the counts above are /metrics')."""

    def _change(self, name: str, **changes: Any) -> None:
        # Called with the lock held.
        self._by_name[name] = replace(self._by_name.get(name) or DeploymentTelemetry(), **changes)

    def track(self, name: str) -> None:
        """Make the deployment's series exist (at zero) before anything happens to it."""
        with self._lock:
            self._by_name.setdefault(name, DeploymentTelemetry())

    def booted(self, name: str, kind: str, seconds: float | None, compile_cache_hit: bool | None) -> None:
        with self._lock:
            now = self._by_name.get(name) or DeploymentTelemetry()
            changes: dict[str, Any] = {"boots": _bump(now.boots, kind), "last_boot": {"kind": kind, "seconds": seconds}}
            if seconds is not None:
                histogram = now.boot_seconds.get(kind) or Histogram()
                changes["boot_seconds"] = MappingProxyType({**now.boot_seconds, kind: histogram.observe(seconds)})
            if compile_cache_hit is True:
                changes["compile_cache_hits"] = now.compile_cache_hits + 1
            elif compile_cache_hit is False:
                changes["compile_cache_misses"] = now.compile_cache_misses + 1
            self._change(name, **changes)

    def failed(self, name: str, cause: str) -> None:
        with self._lock:
            now = self._by_name.get(name) or DeploymentTelemetry()
            self._change(name, failures=_bump(now.failures, cause))

    def restarted(self, name: str, cause: str) -> None:
        with self._lock:
            now = self._by_name.get(name) or DeploymentTelemetry()
            self._change(name, restarts=_bump(now.restarts, cause))

    def probed(self, name: str, at: float, error: str | None, failures_in_a_row: int) -> None:
        with self._lock:
            now = self._by_name.get(name) or DeploymentTelemetry()
            liveness: dict[str, Any] = {
                "last_probe_at": at,
                "last_probe_ok": error is None,
                "probe_failures_in_a_row": failures_in_a_row,
            }
            if error is not None:
                liveness["last_probe_error"] = error
            self._change(
                name,
                probes_ok=now.probes_ok + (error is None),
                probes_failed=now.probes_failed + (error is not None),
                liveness=liveness,
            )

    def swapped(self, name: str, direction: str, seconds: float) -> None:
        """A swap group member fell asleep or woke (`direction` sleep or wake) in `seconds`."""
        with self._lock:
            now = self._by_name.get(name) or DeploymentTelemetry()
            histogram = now.swap_seconds.get(direction) or Histogram(SWAP_BUCKETS, (0,) * len(SWAP_BUCKETS))
            self._change(
                name, swap_seconds=MappingProxyType({**now.swap_seconds, direction: histogram.observe(seconds)})
            )

    def slower_than_predicted(self, name: str, kind: str) -> None:
        """A boot or wake of `kind` (prediction.timing_kind) took more than twice its prediction."""
        with self._lock:
            now = self._by_name.get(name) or DeploymentTelemetry()
            self._change(name, slower_than_predicted=_bump(now.slower_than_predicted, kind))

    def swap_check_failed(self, name: str, check: str) -> None:
        """A sleep (`check` sleep) or wake (wake) failed its verification (supervisor.fleet.swap_checks)."""
        with self._lock:
            now = self._by_name.get(name) or DeploymentTelemetry()
            self._change(name, swap_checks_failed=_bump(now.swap_checks_failed, check))

    def snapshot_event(self, name: str, event: str, seconds: float | None = None) -> None:
        """A capture or restore ended (`event`: SNAPSHOT_EVENTS); `seconds` the outage or the restore."""
        with self._lock:
            now = self._by_name.get(name) or DeploymentTelemetry()
            changes: dict[str, Any] = {"snapshots": _bump(now.snapshots, event)}
            kind = {"captured": "capture_outage", "restored": "restore"}.get(event)
            if kind is not None and seconds is not None:
                total = now.snapshot_seconds.get(kind, 0.0) + seconds
                changes["snapshot_seconds"] = MappingProxyType({**now.snapshot_seconds, kind: total})
            self._change(name, **changes)

    def preemption_warned(self, name: str, at: float, message: str, new_preemptions: int) -> None:
        with self._lock:
            now = self._by_name.get(name) or DeploymentTelemetry()
            warning = {"at": at, "message": message, "new_preemptions": new_preemptions}
            self._change(name, preemption_warnings=now.preemption_warnings + 1, preemption_warning=warning)

    def snapshot(self) -> dict[str, DeploymentTelemetry]:
        with self._lock:
            return dict(self._by_name)

    def of(self, name: str) -> DeploymentTelemetry:
        with self._lock:
            return self._by_name.get(name) or DeploymentTelemetry()
