"""Readings taken in the background so that nobody waits for them: every GPU's memory (NVML or
the recorded host file) and each ready server's /metrics, refreshed every
`serving_scrape_interval_seconds` by one thread, each HTTP read bounded by a timeout.

The daemon's /metrics, `dankserve status` and the liveness checks read the cached values (one
source of the numbers); a scrape of ours never waits on a GPU or a server. Rising preemption
counts are logged here with their advice, at most once per `preemption_warning_interval_seconds`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from dankserve.backend_address import BackendAddress
from dankserve.host.gpu_memory import GpuMemory
from dankserve.supervisor.observe.serving import PreemptionWatch, ServingSample, parse_serving, preemption_notice
from dankserve.supervisor.observe.telemetry import Telemetry
from dankserve.supervisor.probes.health import fetch_metrics

log = structlog.get_logger("dankserve")

SCRAPE_TIMEOUT_SECONDS = 1.0
"""The longest one read of a server's /metrics may take (a hung server costs this, no more)."""


@dataclass(frozen=True)
class ServingTarget:
    """A ready deployment whose /metrics to read."""

    name: str
    address: BackendAddress


class Observatory:
    """The background reader and its cache (thread-safe)."""

    def __init__(
        self,
        *,
        targets: Callable[[], Sequence[ServingTarget]],
        read_gpus: Callable[[], dict[str, GpuMemory]],
        telemetry: Telemetry,
        interval: float,
        preemption_interval: float,
    ) -> None:
        self._targets = targets
        self._read_gpus = read_gpus
        self._telemetry = telemetry
        self._interval = interval
        self._preemption_interval = preemption_interval
        self._lock = threading.Lock()
        self._samples: dict[str, ServingSample] = {}
        self._scrape_ok: dict[str, bool] = {}
        self._watches: dict[str, PreemptionWatch] = {}
        self._gpus: dict[str, GpuMemory] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="observatory", daemon=True)

    def start(self) -> None:
        self.refresh()
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)

    def poke(self) -> None:
        """Read again now (a deployment became ready or stopped)."""
        self._wake.set()

    # -- reads -------------------------------------------------------------------------------
    def sample(self, name: str) -> ServingSample | None:
        with self._lock:
            return self._samples.get(name)

    def samples(self) -> dict[str, ServingSample]:
        with self._lock:
            return dict(self._samples)

    def scrape_ok(self) -> dict[str, bool]:
        with self._lock:
            return dict(self._scrape_ok)

    def gpus(self, uuids: Sequence[str] | None = None) -> dict[str, GpuMemory]:
        """The last GPU readings (all GPUs, or these), by UUID."""
        with self._lock:
            if uuids is None:
                return dict(self._gpus)
            return {u: self._gpus[u] for u in uuids if u in self._gpus}

    # -- the loop ----------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.refresh()
            except Exception:  # never let a reading kill the thread
                log.exception("observatory_error")

    def refresh(self) -> None:
        """One round: GPU memory, then every ready server's /metrics."""
        try:
            gpus = self._read_gpus()
        except Exception as exc:
            log.warning("gpu_memory_unreadable", error=str(exc))
            gpus = {}
        targets = list(self._targets())
        fresh: dict[str, ServingSample] = {}
        ok: dict[str, bool] = {}
        for target in targets:
            sample = self._scrape(target)
            ok[target.name] = sample is not None
            if sample is not None:
                fresh[target.name] = sample
        with self._lock:
            self._gpus = gpus
            self._samples = fresh
            self._scrape_ok = ok
            # A deployment no longer ready starts its preemption baseline again when it is back.
            self._watches = {n: w for n, w in self._watches.items() if n in ok}
        for name, sample in fresh.items():
            self._watch_preemptions(name, sample)

    def _scrape(self, target: ServingTarget) -> ServingSample | None:
        text = fetch_metrics(target.address, timeout=SCRAPE_TIMEOUT_SECONDS)
        if text is None:
            return None
        try:
            return parse_serving(text, time.monotonic())
        except ValueError as exc:
            log.warning("serving_metrics_unreadable", deployment=target.name, error=str(exc))
            return None

    def _watch_preemptions(self, name: str, sample: ServingSample) -> None:
        with self._lock:
            watch = self._watches.get(name, PreemptionWatch())
        watch, notice = preemption_notice(watch, sample.preemptions_total, time.time(), self._preemption_interval)
        with self._lock:
            self._watches[name] = watch
        if notice is not None:
            log.warning(
                "preemptions",
                deployment=name,
                new_preemptions=notice.new_preemptions,
                preemptions_total=notice.total,
                advice=notice.message,
            )
            self._telemetry.preemption_warned(name, notice.at, notice.message, notice.new_preemptions)
