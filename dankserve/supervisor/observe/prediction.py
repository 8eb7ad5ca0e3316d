"""Predicted boot and wake times from a deployment's recorded history (issue 29), pure.

The daemon records how long each boot and swap took (`DeploymentState.timings`, kept in
state.json across restarts); a prediction is the median of the last few of each kind, or none
without history. Status shows the predictions, the gateway turns them into SSE loading comments,
Retry-After and /v1/models' ready seconds, and a boot or wake more than twice as slow as its
prediction is logged (`slower_than_predicted`) and counted.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dankserve.state import KEPT

WINDOW = 5
"""A prediction is the median of this many latest timings: one odd boot moves it little."""
SLOWER_FACTOR = 2.0
"""A boot or wake taking more than this many times its prediction is `slower_than_predicted`."""


def timing_kind(boot_kind: str) -> str:
    """The prediction a boot of `boot_kind` (telemetry.BOOT_KINDS) counts towards."""
    if boot_kind in ("cold", "wake", "restore"):
        return boot_kind
    return "warm"


@dataclass(frozen=True)
class Predicted:
    """Predicted seconds of each kind (None: no history of it)."""

    cold: float | None = None
    warm: float | None = None
    wake: float | None = None
    sleep: float | None = None
    restore: float | None = None
    """A snapshot's restore (issue 41)."""

    def of(self, kind: str) -> float | None:
        return {
            "cold": self.cold,
            "warm": self.warm,
            "wake": self.wake,
            "sleep": self.sleep,
            "restore": self.restore,
        }.get(kind)

    def boot(self) -> float | None:
        """A boot's prediction before its kind is known: warm once it booted warm before (the compile cache
        stays), else cold."""
        return self.warm if self.warm is not None else self.cold

    def to_json(self) -> dict[str, float | None]:
        return {
            "cold_seconds": self.cold,
            "warm_seconds": self.warm,
            "wake_seconds": self.wake,
            "restore_seconds": self.restore,
        }


def predict(timings: Mapping[str, Sequence[float]], window: int = WINDOW) -> Predicted:
    """The median of the last `window` timings of each kind."""

    def median(kind: str) -> float | None:
        latest = list(timings.get(kind, ()))[-window:]
        return round(statistics.median(latest), 3) if latest else None

    return Predicted(median("cold"), median("warm"), median("wake"), median("sleep"), median("restore"))


def remembered(
    timings: Mapping[str, Sequence[float]], kind: str, seconds: float, keep: int = KEPT
) -> dict[str, tuple[float, ...]]:
    """The timings with one more of `kind`, at most `keep` of each."""
    out = {k: tuple(v) for k, v in timings.items()}
    out[kind] = (*out.get(kind, ()), round(seconds, 3))[-keep:]
    return out


def slower_than_predicted(seconds: float, predicted: float | None) -> bool:
    """More than SLOWER_FACTOR times the prediction (never without one)."""
    return predicted is not None and seconds > SLOWER_FACTOR * predicted


def remaining(predicted: float | None, elapsed: float) -> float | None:
    """Seconds still to go of something predicted to take `predicted` that began `elapsed` ago (None: unknown).

    Past its prediction it is due any moment: a tenth of the prediction, so a client asks again soon."""
    if predicted is None:
        return None
    left = predicted - max(elapsed, 0.0)
    return round(left if left > 0 else predicted / 10, 3)
