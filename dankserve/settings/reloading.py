"""What a reload does with each global key: applied at once, or kept until the daemon restarts. Pure.

A reload takes the file's deployments whole. A global key is either read where it is used (the
next plan, the next stop: a reload applies it, the way below says) or was built into a part the
daemon starts once (the Podman client, the gateway's socket, the metrics endpoint, each
deployment's lifecycle timers ...): for those the daemon keeps running the value it started with,
everywhere, and says which keys wait for a restart (`dankserve reload`, `dankserve status`).
Every global key of `Settings` is in `ON_RELOAD` (a test fails for one that is not).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dankserve.settings.model import Settings


@dataclass(frozen=True)
class OnReload:
    """Whether a reload applies a global key, and how (or why it waits for a restart)."""

    applied: bool
    how: str


def _applied(how: str) -> OnReload:
    return OnReload(True, how)


def _restart(why: str) -> OnReload:
    return OnReload(False, why)


_LIFECYCLE = "each deployment's lifecycle (timers, restart budget) holds it from the deployment's start"

ON_RELOAD: Mapping[str, OnReload] = {
    "podman_url": _restart("the Podman client is made once, at start"),
    "state_dir": _restart("the daemon's lock, pid file, control socket and learned facts live there"),
    "cache_dir": _restart("checked to be the daemon's own at start; running servers mount their caches from it"),
    "hf_cache_dir": _restart("checked to be the daemon's own at start; running servers mount it"),
    "vllm_version": _applied("the next plan of each deployment (its next boot) reads it"),
    "upgrade": _applied("the next `dankserve upgrade` (or the timer's) reads it"),
    "restart_backoff_initial_seconds": _restart(_LIFECYCLE),
    "restart_backoff_max_seconds": _restart(_LIFECYCLE),
    "restart_backoff_multiplier": _restart(_LIFECYCLE),
    "restart_jitter_seconds": _restart(_LIFECYCLE),
    "failure_window_seconds": _restart(_LIFECYCLE),
    "max_failures_in_window": _restart(_LIFECYCLE),
    "boot_timeout_seconds": _restart(_LIFECYCLE),
    "stop_timeout_seconds": _applied("each stop from then on waits this long"),
    "gpu_memory_settle_seconds": _restart(_LIFECYCLE),
    "health_interval_seconds": _restart(_LIFECYCLE),
    "gateway": _restart("the gateway binds its address and reads its limits and key once, at start"),
    "metrics_listen": _restart("the metrics endpoint binds once, at start"),
    "metrics_api_key_file": _restart("the metrics endpoint reads its key once, at start"),
    "serving_scrape_interval_seconds": _restart("the observatory's reading period is set at start"),
    "stall_seconds": _restart("each ready server's liveness checks hold it"),
    "liveness_interval_seconds": _restart("each ready server's liveness checks hold it"),
    "liveness_timeout_seconds": _restart("each ready server's liveness checks hold it"),
    "preemption_warning_interval_seconds": _restart("the observatory's warning period is set at start"),
    "log_format": _restart("the log output is set up once, at start"),
    "cluster": _restart("the cluster API binds and reads its TLS files and token once, at start"),
}
"""Every global key (all of `Settings` but `deployments`): what a reload does with it."""


def global_keys() -> tuple[str, ...]:
    """The settings model's keys beside the deployments, in its order."""
    return tuple(name for name in Settings.model_fields if name != "deployments")


@dataclass(frozen=True)
class ReloadEffects:
    """An accepted file's effect on the running settings."""

    settings: Settings
    """What the daemon runs with now: the file's deployments and applied keys, the running values of the rest."""
    applied: tuple[str, ...]
    """Global keys the file changed that are applied now."""
    needs_restart: tuple[str, ...]
    """Global keys whose value in the file is not the running one: they wait for a daemon restart."""


def reload_effects(running: Settings, loaded: Settings) -> ReloadEffects:
    """The settings to run with after the file `loaded` replaced `running`, and which global keys differ."""
    changed = [key for key in global_keys() if getattr(running, key) != getattr(loaded, key)]
    applied = tuple(key for key in changed if ON_RELOAD[key].applied)
    restart = tuple(key for key in changed if not ON_RELOAD[key].applied)
    kept = loaded.model_copy(update={key: getattr(running, key) for key in restart}) if restart else loaded
    return ReloadEffects(kept, applied, restart)


def pending_changes(running: Settings, on_disk: Settings) -> tuple[str, ...]:
    """What the file on disk changed against the running settings that a reload would apply: each global key
    applied at a reload whose value differs, and `deployments.NAME` for each deployment added, removed or
    changed (keys that wait for a restart are `reload_effects`' `needs_restart`, said apart)."""
    was, now = running.model_dump(mode="json"), on_disk.model_dump(mode="json")
    keys = [key for key in global_keys() if ON_RELOAD[key].applied and was.get(key) != now.get(key)]
    before, after = was.get("deployments") or {}, now.get("deployments") or {}
    names = sorted(set(before) | set(after))
    return (*keys, *(f"deployments.{name}" for name in names if before.get(name) != after.get(name)))
