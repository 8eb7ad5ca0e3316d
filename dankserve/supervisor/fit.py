"""The fit check of a configuration: every enabled deployment planned, then `plan.checks.check_fit_together`
(GPUs shared within 0.95, a swap group counting what may be awake at once, CPU offload within the host's
RAM). At start (preflight) and before a reload takes effect."""

from __future__ import annotations

from collections.abc import Callable

from dankserve.errors import HubUnreachable, MemberUnreachable
from dankserve.host.model import Host
from dankserve.plan.checks import check_fit_together
from dankserve.settings import DeploymentSettings, Settings
from dankserve.supervisor.edges import Planner
from dankserve.supervisor.machine import BootOverrides


def _as_configured(name: str, dep: DeploymentSettings) -> DeploymentSettings:
    return dep


def check_fit(
    planner: Planner,
    host: Host,
    settings: Settings,
    as_run: Callable[[str, DeploymentSettings], DeploymentSettings] = _as_configured,
) -> None:
    """Raise the user error when the enabled deployments of `settings` do not fit together on `host`.

    A reload that would over-commit a GPU (a member leaving its group, a changed `pinned`, a new
    deployment) is refused like a malformed file. A follower of a multi-host group that is not up yet
    is not an error here: its worker retries with backoff. Neither is a Hub that does not answer for a
    model not yet cached (the network may come up later): its worker downloads first, or plans again
    later. `as_run`: each deployment as it would run (the daemon's: the image an upgrade switched it to)."""
    plans = []
    for name, dep in settings.deployments.items():
        if not dep.enabled:
            continue
        try:
            plans.append(planner(name, as_run(name, dep), host, BootOverrides(), None))
        except (MemberUnreachable, HubUnreachable):
            continue
    check_fit_together(plans, settings.deployments.items(), host)
