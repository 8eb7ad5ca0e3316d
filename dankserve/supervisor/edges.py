"""The shapes of the edges a deployment's worker reaches the world through: the planner, the runtimes,
the weights' download, the port check, /health, sleep mode, the followers' GPUs, the jitter's draw.
The daemon's `DaemonDeps` holds them; a worker sees them as `WorkerEdges`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from dankserve.backend_address import BackendAddress
from dankserve.host.model import GpuIdentity, Host
from dankserve.plan.types import Plan
from dankserve.runtime.base import Runtime
from dankserve.settings import DeploymentSettings
from dankserve.supervisor import machine as m
from dankserve.supervisor.machine import BootOverrides
from dankserve.supervisor.probes.warm_up import WarmUpOutcome

Planner = Callable[[str, DeploymentSettings, Host, BootOverrides, str | None], Plan]
RuntimeFactory = Callable[[DeploymentSettings], Runtime]
WeightsFetcher = Callable[[str, DeploymentSettings, Callable[[int], None]], "m.WeightsFailed | None"]
"""fetch(name, dep, progress) -> None when the weights are in place, or WeightsFailed (permanent or not)."""


class WorkerEdges(Protocol):
    """The world a worker's commands reach (the daemon's `DaemonDeps` is one)."""

    @property
    def planner(self) -> Planner: ...

    @property
    def runtime_for(self) -> RuntimeFactory: ...

    @property
    def fetch_weights(self) -> WeightsFetcher | None: ...

    @property
    def check_port(self) -> Callable[[BackendAddress], str | None]: ...

    @property
    def health(self) -> Callable[[BackendAddress, float], m.HealthChecked] | None: ...

    @property
    def warm_up(self) -> Callable[[BackendAddress, str, str | None, float], WarmUpOutcome]: ...

    @property
    def draw(self) -> Callable[[], float]: ...

    @property
    def follower_gpus(self) -> Callable[[str, DeploymentSettings, bool], Sequence[tuple[GpuIdentity, int]]] | None: ...

    @property
    def sleep_server(self) -> Callable[[BackendAddress, str | None, m.SleepLevel], m.Event]: ...

    @property
    def wake_server(self) -> Callable[[BackendAddress, str | None, m.SleepLevel], m.Event]: ...

    @property
    def is_sleeping(self) -> Callable[[BackendAddress, str | None], bool | None]: ...
