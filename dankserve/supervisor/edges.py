"""The shapes of the edges the daemon's planning and booting go through: the planner, the runtimes, the
weights' download. `world.World` holds them (with the rest of what the daemon reaches)."""

from __future__ import annotations

from collections.abc import Callable

from dankserve.host.model import Host
from dankserve.plan.types import Plan
from dankserve.runtime.base import Runtime
from dankserve.settings import DeploymentSettings
from dankserve.supervisor import machine as m
from dankserve.supervisor.machine import BootOverrides

Planner = Callable[[str, DeploymentSettings, Host, BootOverrides, str | None], Plan]
RuntimeFactory = Callable[[DeploymentSettings], Runtime]
WeightsFetcher = Callable[[str, DeploymentSettings, Callable[[int], None]], "m.WeightsFailed | None"]
"""fetch(name, dep, progress) -> None when the weights are in place, or WeightsFailed (permanent or not)."""
