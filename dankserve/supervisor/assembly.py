"""Builds the daemon from settings: the planner, the runtimes and the host, checked up front.

The daemon exits 2/3/4 before supervising anything when a deployment cannot be planned or a
runtime cannot be reached, so systemd's RestartPreventExitStatus stops a restart loop.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dankserve.host.model import Host
from dankserve.plan.types import Plan
from dankserve.runtime.base import Runtime
from dankserve.runtime.log_archive import LogArchive
from dankserve.settings import DeploymentSettings, Settings, SettingsSource, as_source, keyless_gateway_exposure
from dankserve.supervisor import machine as m
from dankserve.supervisor.daemon import BootOverrides, Daemon, DaemonParts, Planner, Services, WeightsFetcher, log
from dankserve.supervisor.fit import check_fit
from dankserve.supervisor.world import ClusterEdges, World

if TYPE_CHECKING:
    from dankserve.cluster.context import ClusterContext


SERVER_LOGS = "server-logs"
"""Under the state dir: the lines of each deployment's last ended servers (`runtime.log_archive`)."""


class _Runtimes:
    """One runtime object per kind, created on first use."""

    def __init__(self, settings: Settings | SettingsSource, cluster: ClusterContext | None = None) -> None:
        self._settings = as_source(settings)
        self._cluster = cluster
        self._podman: Runtime | None = None
        self._process: Runtime | None = None

    def __call__(self, dep: DeploymentSettings) -> Runtime:
        if dep.hosts and self._cluster is not None:
            return self._cluster.runtime(dep, self._single(dep))
        return self._single(dep)

    def _single(self, dep: DeploymentSettings) -> Runtime:
        if dep.runtime == "process":
            if self._process is None:
                from dankserve.host.gpu_memory import wait_gpu_memory_released
                from dankserve.runtime.process import ProcessRuntime

                state_dir = self._settings.current().state_dir
                self._process = ProcessRuntime(
                    state_dir / "processes", wait_gpu_memory_released, LogArchive(state_dir / SERVER_LOGS)
                )
            return self._process
        if self._podman is None:
            from dankserve.runtime.podman import PodmanRuntime

            settings = self._settings.current()
            self._podman = PodmanRuntime(
                settings.podman_url, cache_dir=settings.state_dir, archive=LogArchive(settings.state_dir / SERVER_LOGS)
            )
            self._podman.remove_abandoned_probes()  # a daemon killed while it read an image's version left one
        return self._podman


def runtime_factory(settings: Settings | SettingsSource, cluster: ClusterContext | None = None) -> _Runtimes:
    """A callable giving the runtime of a deployment's kind (a group's for one with hosts)."""
    return _Runtimes(settings, cluster)


def make_planner(settings: Settings | SettingsSource, cluster: ClusterContext | None = None) -> Planner:
    """The planner the daemon calls for each boot (with every member's hardware for a group), with the settings
    of that moment."""
    source = as_source(settings)

    def plan(
        name: str, dep: DeploymentSettings, host: Host, overrides: BootOverrides, vllm_version: str | None
    ) -> Plan:
        from dankserve.planning import plan_one

        return plan_one(
            source.current(),
            name,
            dep,
            host,
            vllm_version=vllm_version,
            learned_kv_cache_memory_bytes=overrides.kv_cache_memory_bytes,
            max_model_len=overrides.max_model_len,
            gpu_memory_utilization=overrides.gpu_memory_utilization,
            group=cluster.members(dep, host) if dep.hosts and cluster is not None else None,
        )

    return plan


def weights_fetcher(settings: Settings | SettingsSource) -> WeightsFetcher:
    """The daemon's downloads (dankserve.hub.weights), their refusals as the machine's events:
    a gated or unknown model fails the deployment; no network or a full disk is retried."""
    from dankserve.errors import DankserveError, InvalidInput
    from dankserve.hub.weights import WeightsFetcher as HubWeights

    fetch = HubWeights(as_source(settings))

    def fetch_weights(name: str, dep: DeploymentSettings, progress: Callable[[int], None]) -> m.WeightsFailed | None:
        try:
            fetch(name, dep, progress)
        except DankserveError as exc:
            return m.WeightsFailed(exc.render(), permanent=isinstance(exc, InvalidInput))
        return None

    return fetch_weights


def build_world(
    source: SettingsSource, hardware_file: Path | None, config_path: Path | None, cluster: ClusterContext
) -> World:
    """The daemon's world, built once: the settings' holder, the state store, the host and the one GPU reader
    (the recorded host file where one drives this run, else NVML), the runtimes, the planner, the Hub."""
    from dankserve.host.gpu_processes import stand_in_dir
    from dankserve.host.gpu_reader import gpu_reader
    from dankserve.host.probe import load_host
    from dankserve.snapshot.gpu_helper import gpu_checkpoint_for
    from dankserve.supervisor.records import StateBook

    settings = source.current()
    host = load_host(hardware_file, cache_dirs=[settings.cache_dir, settings.hf_cache_dir])
    return World(
        source=source,
        state=StateBook(settings.state_dir),
        host=host,
        gpus=gpu_reader(hardware_file, host),
        planner=make_planner(source, cluster),
        runtime_for=runtime_factory(source, cluster),
        fetch_weights=weights_fetcher(source),
        cluster=ClusterEdges(
            describe_hosts=cluster.hosts,
            follower_gpus=lambda name, dep, strict: cluster.follower_gpus(name, dep, strict=strict),
        ),
        config_path=config_path,
        gpu_checkpoint=lambda: gpu_checkpoint_for(stand_in_dir(hardware_file)),
    )


def build_daemon(settings: Settings, hardware_file: Path | None, config_path: Path | None) -> Daemon:
    """A daemon ready to run, after checking that its dirs are its own and every enabled deployment can be planned."""
    from dankserve.cluster.context import ClusterContext
    from dankserve.supervisor.instance import check_daemon_dirs

    check_daemon_dirs(settings.state_dir, {"cache_dir": settings.cache_dir, "hf_cache_dir": settings.hf_cache_dir})
    source = SettingsSource(settings)  # the one holder: every part below and the daemon read it
    cluster = ClusterContext(source)
    world = build_world(source, hardware_file, config_path, cluster)
    preflight(world)
    return Daemon(world, services=lambda parts: start_services(parts, cluster))


def start_services(parts: DaemonParts, cluster: ClusterContext) -> Services:
    """The cluster API (with [cluster]) and the gateway (with [gateway]), handed the daemon's parts they use."""
    world = parts.world
    close_cluster = cluster.start_api(lambda: world.host, parts.gpus.memory)
    gateway_settings = world.settings.gateway
    if gateway_settings is None:
        return Services(close_cluster)
    from dankserve.gateway.service import start_gateway
    from dankserve.gateway.usage_store import usage_path
    from dankserve.supervisor.control.gateway_link import DaemonSupervisor
    from dankserve.supervisor.control.metrics_service import log_feed

    try:
        supervisor = DaemonSupervisor(parts.fleet, parts.coordinator, parts.upgrades)
        gateway, access = start_gateway(
            gateway_settings,
            lambda: world.settings.deployments,
            supervisor,
            usage_file=usage_path(world.settings.state_dir),
            console=parts.answer,  # the web console asks what the control socket answers
            logs=log_feed(world),  # and reads the lines `dankserve logs` reads
        )
    except BaseException:
        close_cluster()
        raise
    for name in world.settings.deployments:
        exposure = keyless_gateway_exposure(world.settings, name)
        if exposure is not None:
            log.warning("gateway_passes_key", deployment=name, message=exposure)

    def close() -> None:
        gateway.close()
        close_cluster()

    # Every reload reads the key files again before it is accepted: one that cannot be read refuses it.
    return Services(
        close,
        gateway_usage=access.totals,  # /metrics: requests and tokens per key
        reload_check=lambda settings: access.prepare_reload(settings.gateway or gateway_settings),
    )


def preflight(world: World) -> None:
    """Check that the enabled deployments' plans fit together (`fit.check_fit`, each as it runs: the image an
    upgrade switched it to), then reach each one's runtime; raise the user error if one fails.

    Every plan comes first: a configuration error (exit 2) is reported as such even when a
    runtime is unreachable too (exit 3), whatever the order of the deployments.
    """
    settings = world.settings
    check_fit(world.planner, world.host, settings, world.state.as_run)
    for dep in settings.deployments.values():
        if dep.enabled:
            world.runtime_for(dep).list_workloads()
