"""What a reload did, as `dankserve reload` and `dankserve status` report it. Pure data.

A reload (SIGHUP, `systemctl reload`, `dankserve reload`) either is refused (the file does not
validate, or the deployments would not fit together: the running config stays) or is accepted:
then each deployment restarts (its server plans differently), starts (new, or enabled again),
stops (removed or disabled) or keeps running (unchanged, only its swap settings changed, or only
its LoRA adapters, loaded and unloaded in place by `supervisor.worker.adapters`); each changed global key
is applied or waits for a daemon restart (`dankserve.settings.reloading`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

RELOAD_WAIT_SECONDS = 100.0
"""How long a reload request waits for its answer (planning every deployment: the Hub may be slow)."""


@dataclass(frozen=True)
class ConfigRefusal:
    """The config file a reload refused: when, why, and what to do."""

    at: float
    error: str
    fix: str | None

    def to_json(self) -> dict[str, Any]:
        return {"at": self.at, "error": self.error, "fix": self.fix}


@dataclass(frozen=True)
class AdaptersInPlace:
    """A kept server's LoRA adapters a reload changed in place: added names loaded, removed ones unloaded, and
    re-pointed ones (a new source under the same name) unloaded, then loaded from the new source."""

    loaded: tuple[str, ...] = ()
    unloaded: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()

    @classmethod
    def of(cls, loads: tuple[str, ...], unloads: tuple[str, ...]) -> AdaptersInPlace:
        """From the names posted to vLLM's load and unload routes (a re-pointed name is in both)."""
        both = set(loads) & set(unloads)
        return cls(
            tuple(n for n in loads if n not in both),
            tuple(n for n in unloads if n not in both),
            tuple(n for n in loads if n in both),
        )

    def to_json(self) -> dict[str, list[str]]:
        return {"loaded": list(self.loaded), "unloaded": list(self.unloaded), "replaced": list(self.replaced)}


@dataclass(frozen=True)
class ReloadOutcome:
    """One reload's answer: refused (with why), or accepted with what each deployment does."""

    at: float
    refusal: ConfigRefusal | None = None
    restart: tuple[str, ...] = ()
    start: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()
    applied: tuple[str, ...] = ()
    """Global keys the file changed that the daemon runs with now."""
    needs_restart: tuple[str, ...] = ()
    """Global keys the file changed that keep their running values until the daemon restarts."""
    adapters: Mapping[str, AdaptersInPlace] = field(default_factory=dict)
    """Kept deployments (in `keep`) whose adapters were loaded and unloaded in the running server."""

    @property
    def accepted(self) -> bool:
        return self.refusal is None

    def to_json(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "at": self.at,
            "refused": self.refusal.to_json() if self.refusal is not None else None,
            "restart": list(self.restart),
            "start": list(self.start),
            "stop": list(self.stop),
            "keep": list(self.keep),
            "applied": list(self.applied),
            "needs_restart": list(self.needs_restart),
            "adapters": {name: change.to_json() for name, change in self.adapters.items()},
        }
