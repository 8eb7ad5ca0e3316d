"""Tests for dankserve.cluster.context: the daemon's multi-host parts read the running settings."""

from __future__ import annotations

from pathlib import Path

from dankserve.cluster.context import ClusterContext
from dankserve.settings import DeploymentSettings, ReloadEffects, Settings, SettingsSource


def test_a_group_added_by_a_reload_is_seen_through_the_daemons_settings_source() -> None:
    """The context asks the daemon's source, so a multi-host deployment a reload added shows its hosts
    (it held a copy of the start's settings before, and knew no such deployment)."""
    source = SettingsSource(Settings(hf_cache_dir=Path("/hf")))
    context = ClusterContext(source)
    assert context.hosts("group") is None
    added = DeploymentSettings(model="org/big", hosts=["10.0.0.2:7390"])
    source.accept(ReloadEffects(source.current().model_copy(update={"deployments": {"group": added}}), (), ()))
    assert context.hosts("group") == [
        {"address": "10.0.0.2:7390", "role": "follower", "state": "unknown", "message": None}
    ]
