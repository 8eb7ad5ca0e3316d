"""Liveness beyond /health: is a ready engine still producing tokens? Pure.

vLLM's /health can answer 200 while the engine hangs (vLLM issue 49237, GPUStack issue 3189).
Two signs catch it, each checked while the deployment is ready:

- **stall**: requests are running or waiting, yet no token (prompt or generation) has been
  processed for `stall_seconds`, read from vLLM's own counters;
- **token probe**: while idle, at most every `liveness_interval_seconds`, a one-token
  completion on loopback; two failures in a row (an error or no answer within the timeout).
  After a failure the next probe is due one interval later even when not idle: a hung engine's
  counters may still show the probe it never answered.

Either verdict is `engine_hung`: the supervisor restarts under the failure policy with the
evidence as the failure's message. The shell feeds samples and probe results in and runs the
probes these functions ask for.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from dankserve.supervisor.observe.serving import ServingSample

PROBE_FAILURES = 2
"""Failed token probes in a row that count as a hung engine."""


@dataclass(frozen=True)
class LivenessSettings:
    stall_seconds: float
    """Pending requests without any token for this long: hung (0: no stall check)."""
    probe_interval_seconds: float
    """Idle: a token probe at most this often (0: no probes)."""


@dataclass(frozen=True)
class Liveness:
    """What the checks remember while a deployment is ready."""

    progress_at: float
    """When tokens last moved, or nothing was pending (the stall clock's start)."""
    last_probe_at: float
    """When the last probe ended (readiness counts as one: the first probe waits an interval)."""
    tokens: float | None = None
    probe_failures: int = 0
    last_probe_error: str | None = None

    @classmethod
    def ready_at(cls, now: float) -> Liveness:
        return cls(progress_at=now, last_probe_at=now)


@dataclass(frozen=True)
class Verdict:
    action: Literal["ok", "probe", "hung"]
    evidence: str | None = None
    """Why `hung`: what was seen, with numbers."""


OK = Verdict("ok")


def observe(
    state: Liveness, sample: ServingSample | None, now: float, settings: LivenessSettings
) -> tuple[Liveness, Verdict]:
    """Take the latest serving sample into account: hung, a probe due, or nothing to do."""
    pending = 0.0
    if sample is not None:
        tokens = sample.tokens
        pending = sample.pending
        if pending <= 0 or tokens is None or tokens != state.tokens:
            state = replace(state, tokens=tokens, progress_at=now)
        stalled_for = now - state.progress_at
        if settings.stall_seconds > 0 and pending > 0 and stalled_for >= settings.stall_seconds:
            return state, Verdict(
                "hung",
                f"{int(sample.waiting or 0)} requests waiting and {int(sample.running or 0)} running, but no "
                f"token processed for {stalled_for:.0f} s (vLLM's token counters stuck at {int(tokens or 0)}; "
                f"stall_seconds = {settings.stall_seconds:g})",
            )
    if settings.probe_interval_seconds <= 0:
        return state, OK
    idle = pending <= 0
    if (idle or state.probe_failures > 0) and now - state.last_probe_at >= settings.probe_interval_seconds:
        return state, Verdict("probe")
    return state, OK


def probed(state: Liveness, error: str | None, now: float) -> tuple[Liveness, Verdict]:
    """A token probe ended: `error` None when the one-token completion came back."""
    if error is None:
        return replace(state, last_probe_at=now, probe_failures=0, last_probe_error=None), OK
    failures = state.probe_failures + 1
    state = replace(state, last_probe_at=now, probe_failures=failures, last_probe_error=error)
    if failures >= PROBE_FAILURES:
        return state, Verdict(
            "hung", f"/health answered but a one-token completion failed {failures} times in a row (last: {error})"
        )
    return state, OK
