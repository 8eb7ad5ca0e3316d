"""The daemon's world: everything outside its own threads that it reaches, built once by `assembly.py`
(`assembly.build_world`) and never rebuilt. Services take the fields they use; nothing takes the daemon.

It holds the settings' one holder, the state store, the host as loaded at start and the one GPU
reader chosen for this run (NVML, or the recorded host of a test or demo run), the clock, the
planner, the runtimes, the weights' download (the Hub), the loopback edges to a server
(`ServerEdges`) and the multi-host group's hooks (`ClusterEdges`). In-process tests build one from
fakes (`dankserve.testing.lifecycle.FakeRuntime`, a fake clock, stand-in GPUs).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dankserve.backend_address import BackendAddress
from dankserve.host.gpu_reader import GpuReader
from dankserve.host.model import GpuIdentity, Host
from dankserve.settings import DeploymentSettings, Settings, SettingsSource
from dankserve.snapshot.gpu import GpuCheckpoint
from dankserve.snapshot.gpu_helper import gpu_checkpoint_for
from dankserve.supervisor import machine as m
from dankserve.supervisor.clock import Clock, SystemClock
from dankserve.supervisor.edges import Planner, RuntimeFactory, WeightsFetcher
from dankserve.supervisor.fleet import swap_verify
from dankserve.supervisor.ports import port_holder
from dankserve.supervisor.probes import checkpoint_routes, sleep_mode
from dankserve.supervisor.probes.warm_up import WarmUpOutcome, warm_up_server
from dankserve.supervisor.records import StateBook


@dataclass(frozen=True)
class ServerEdges:
    """The loopback edges to a deployment's server (and its port), one function each."""

    check_port: Callable[[BackendAddress], str | None] = port_holder
    """Who listens on the address already, or None when it is free."""
    health: Callable[[BackendAddress, float], m.HealthChecked] | None = None
    """/health of (address, timeout); None: the real HTTP probe."""
    warm_up: Callable[[BackendAddress, str, str | None, float], WarmUpOutcome] = warm_up_server
    """The warm-up before READY to (address, served model, API key, timeout): None, or what failed."""
    sleep_server: Callable[[BackendAddress, str | None, m.SleepLevel], m.Event] = sleep_mode.sleep_server
    """Put the server at the address, with this API key, to sleep at level 1 or 2 (issue 16)."""
    wake_server: Callable[[BackendAddress, str | None, m.SleepLevel], m.Event] = sleep_mode.wake_server
    """Wake it (level 2: the staged wake with reload_weights)."""
    is_sleeping: Callable[[BackendAddress, str | None], bool | None] = sleep_mode.is_sleeping
    """Whether the server sleeps (None: no answer): a member an earlier daemon left running."""
    canary: swap_verify.Canary = swap_verify.canary_ids
    """The greedy token ids of the canary prompt from (address, key, model): every wake is checked by it."""
    checkpoint_prepare: Callable[[BackendAddress, str | None], str | None] = checkpoint_routes.prepare
    """vLLM 0.34's `/checkpoint/prepare`, waited for until prepared (a snapshot's capture; None: done)."""
    checkpoint_restore: Callable[[BackendAddress, str | None], str | None] = checkpoint_routes.restore
    """`/checkpoint/restore`: the prepared server serves again (None: done)."""
    checkpoint_prepared: Callable[[BackendAddress, str | None], bool] = checkpoint_routes.prepared
    """The server is prepared for a checkpoint (a capture a killed daemon left midway)."""


@dataclass(frozen=True)
class ClusterEdges:
    """A multi-host group's hooks (`cluster.context.ClusterContext`); none on a daemon without groups."""

    describe_hosts: Callable[[str], list[dict[str, Any]] | None] | None = None
    """The hosts of a multi-host deployment for `status` (None: a single-host one)."""
    follower_gpus: Callable[[str, DeploymentSettings, bool], Sequence[tuple[GpuIdentity, int]]] | None = None
    """A group's followers' GPUs (identity, free bytes now) for boot learning; with strict=True a follower that
    does not answer raises, otherwise it is left out (so learned bytes are not reused)."""


@dataclass(frozen=True)
class World:
    """What the daemon reaches outside its own threads, chosen once."""

    source: SettingsSource
    """The one holder of the running settings: every part reads them through it, when needed."""
    state: StateBook
    """state.json: the owner of runtime facts (learned bytes, down flags, the image an upgrade switched to)."""
    host: Host
    """The host as loaded at start."""
    gpus: GpuReader
    """Its GPUs read now: NVML, or the recorded host file (chosen by `host.gpu_reader.gpu_reader`)."""
    planner: Planner
    runtime_for: RuntimeFactory
    clock: Clock = field(default_factory=SystemClock)
    fetch_weights: WeightsFetcher | None = None
    """Downloads a deployment's weights before its boot, reporting percent done (None: vLLM fetches them)."""
    servers: ServerEdges = field(default_factory=ServerEdges)
    cluster: ClusterEdges = field(default_factory=ClusterEdges)
    draw: Callable[[], float] = random.random
    """The uniform draw in [0, 1) behind the restart jitter."""
    available_ram: Callable[[], int | None] = sleep_mode.available_ram_bytes
    """The host's available RAM now (a level 1 sleep pins the weights there)."""
    config_path: Path | None = None
    """The config file a reload reads (None: the default search)."""
    gpu_checkpoint: Callable[[], GpuCheckpoint] = lambda: gpu_checkpoint_for(None)
    """The CUDA checkpoint edge a snapshot's capture and restore use: the driver's (in its helper process), or
    the stand-in's records on a recorded host; chosen once, as the GPU reader is."""

    @property
    def settings(self) -> Settings:
        """The running settings now (`source.current()`): read them when needed, never keep them."""
        return self.source.current()
