"""The shell around the pure liveness checks: feeds them the observatory's latest serving sample
and the clock, runs the token probes they ask for (in the background, so a hung engine never
blocks the worker), records the outcome in Telemetry, and hands back the evidence of a hang."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import structlog

from dankserve.backend_address import BackendAddress
from dankserve.secret_files import read_key_now
from dankserve.supervisor.observe.serving import ServingSample
from dankserve.supervisor.observe.telemetry import Telemetry
from dankserve.supervisor.probes import liveness
from dankserve.supervisor.probes.health import BackgroundProbe, token_probe

log = structlog.get_logger("dankserve")


class LivenessMonitor:
    """Watches one ready server; `step()` returns the evidence once it counts as hung."""

    def __init__(
        self,
        *,
        name: str,
        workload_id: str | None,
        address: BackendAddress,
        model: str,
        api_key_file: Path | None,
        settings: liveness.LivenessSettings,
        timeout: float,
        sample: Callable[[], ServingSample | None],
        telemetry: Telemetry,
        now: float,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.workload_id = workload_id
        """The server watched (a new one gets a new monitor)."""
        self._name = name
        self._wall = wall
        self._settings = settings
        self._sample = sample
        self._telemetry = telemetry
        self._state = liveness.Liveness.ready_at(now)
        self._probe: BackgroundProbe | None = None

        def probe() -> str | None:
            return token_probe(address, model, read_key_now(api_key_file), timeout)

        self._run_probe = probe

    def step(self, now: float) -> str | None:
        """One look: None while alive, else why the engine counts as hung."""
        if self._probe is not None:
            if not self._probe.done:
                return None
            error = self._probe.error
            self._probe = None
            self._state, verdict = liveness.probed(self._state, error, now)
            self._telemetry.probed(self._name, self._wall(), error, self._state.probe_failures)
            if error is not None:
                log.warning("token_probe_failed", deployment=self._name, error=error, count=self._state.probe_failures)
            if verdict.action == "hung":
                return verdict.evidence
        self._state, verdict = liveness.observe(self._state, self._sample(), now, self._settings)
        if verdict.action == "probe":
            self._probe = BackgroundProbe(self._run_probe)
        return verdict.evidence if verdict.action == "hung" else None
