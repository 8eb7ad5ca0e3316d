"""Wires groups into the daemon: the follower API, a GroupRuntime per multi-host deployment,
the members' hardware for the planner, and the hosts shown by `status`."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from dankserve.cluster.api import (
    ClusterClient,
    ClusterServer,
    GroupTls,
    limits_of,
    read_token,
    split_address,
    tls_of,
)
from dankserve.cluster.follower import FollowerService
from dankserve.cluster.group import GroupConfig, GroupRuntime
from dankserve.cluster.per_host import follower_gpus
from dankserve.cluster.ray_node import ray_executable
from dankserve.errors import ConfigError, EnvironmentUnusable, MemberUnreachable
from dankserve.host.gpu_memory import GpuMemory
from dankserve.host.model import GpuIdentity, Host
from dankserve.plan.cluster import LEADER, GroupMember
from dankserve.planning import compile_cache_dir
from dankserve.runtime.base import Runtime
from dankserve.settings import DeploymentSettings, Settings, SettingsSource, as_source

API_PORT = 7390


class ClusterContext:
    """The daemon's multi-host parts, created from the settings."""

    def __init__(self, settings: Settings | SettingsSource) -> None:
        self._source = as_source(settings)
        self._groups: dict[str, GroupRuntime] = {}
        self._by_name: dict[str, GroupRuntime] = {}
        self._tls: GroupTls | None = None

    @property
    def settings(self) -> Settings:
        """The daemon's settings now (its `SettingsSource`: a reload's deployments are seen at once)."""
        return self._source.current()

    def tls(self) -> GroupTls:
        """This host's TLS contexts, loaded once (a ConfigError when [cluster] names unusable files)."""
        cluster = self.settings.cluster
        assert cluster is not None
        if self._tls is None:
            self._tls = tls_of(cluster)
        return self._tls

    # -- leader ---------------------------------------------------------------------------------
    def _require_cluster(self, dep: DeploymentSettings) -> tuple[str, str]:
        cluster = self.settings.cluster
        if cluster is None:
            raise ConfigError(
                f"a deployment names hosts {dep.hosts} but this daemon has no [cluster] section",
                fix='add [cluster] with listen = "THIS-HOST-ADDRESS:7390" and token_file '
                "(the same token file on every host of the group)",
            )
        token_file = dep.cluster_token_file or cluster.token_file
        return split_address(cluster.listen, API_PORT)[0], read_token(token_file)

    def clients(self, dep: DeploymentSettings) -> tuple[ClusterClient, ...]:
        _, token = self._require_cluster(dep)
        tls = self.tls().client
        return tuple(ClusterClient(address, token, tls, timeout=2.0, default_port=API_PORT) for address in dep.hosts)

    def members(self, dep: DeploymentSettings, host: Host) -> list[GroupMember]:
        """This host and every follower's hardware (MemberUnreachable when one does not answer)."""
        members = [GroupMember(LEADER, host)]
        for client in self.clients(dep):
            answer = client.status()
            members.append(GroupMember(client.address, Host.model_validate(answer["host"])))
        return members

    def follower_gpus(self, name: str, dep: DeploymentSettings, *, strict: bool) -> list[tuple[GpuIdentity, int]]:
        """Every follower's assigned GPUs (in `hosts` order) with their free memory now, for boot learning.

        strict: a follower not answering raises MemberUnreachable (the fingerprint needs its GPUs);
        otherwise its GPUs are left out, so the guard sees fewer GPUs than learned and vLLM profiles.
        """
        out: list[tuple[GpuIdentity, int]] = []
        for client in self.clients(dep):
            try:
                answer = client.status()
            except MemberUnreachable:
                if strict:
                    raise
                continue
            out += [(gpu.identity, gpu.free_bytes) for gpu in follower_gpus(answer, dep.gpus, name)]
        return out

    def runtime(self, dep: DeploymentSettings, inner: Runtime) -> GroupRuntime:
        key = json.dumps([dep.hosts, dep.host, dep.port])
        group = self._groups.get(key)
        if group is None:
            node_ip, _ = self._require_cluster(dep)
            cluster = self.settings.cluster
            assert cluster is not None
            config = GroupConfig(
                followers=self.clients(dep),
                node_ip=node_ip,
                ray=ray_executable(cluster.ray_executable),
                ray_port=cluster.ray_port,
                state_dir=self.settings.state_dir / "ray",
                cache_root=lambda deployment: compile_cache_dir(self.settings, deployment),
            )
            group = GroupRuntime(inner, config)
            self._groups[key] = group
        return group

    def hosts(self, deployment: str) -> list[dict[str, Any]] | None:
        """The group's hosts for `status`, or None for a single-host deployment."""
        dep = self.settings.deployments.get(deployment)
        if dep is None or not dep.hosts:
            return None
        for group in self._groups.values():
            if group.deployment == deployment:
                return group.hosts()
        return [{"address": a, "role": "follower", "state": "unknown", "message": None} for a in dep.hosts]

    # -- follower -------------------------------------------------------------------------------
    def start_api(
        self, host: Callable[[], Host], gpu_memory: Callable[[tuple[str, ...]], Mapping[str, GpuMemory]]
    ) -> Callable[[], None]:
        """Serve the cluster API when [cluster] is configured; the function that stops it.

        `host` is the daemon's host now, `gpu_memory` its live readings (what a leader asks a follower)."""
        cluster = self.settings.cluster
        if cluster is None:
            return lambda: None
        settings = self.settings
        service = FollowerService(
            cluster,
            settings.state_dir,
            host,
            gpu_memory=gpu_memory,
            cache_root=lambda deployment: compile_cache_dir(self.settings, deployment),
        )
        service.remove_stale()
        address = split_address(cluster.listen, API_PORT)
        try:
            server = ClusterServer(
                address, read_token(cluster.token_file), service, self.tls().server, limits_of(cluster)
            )
        except OSError as exc:
            raise EnvironmentUnusable(
                f"the cluster API cannot listen on {cluster.listen}: {exc.strerror or exc}",
                fix="set [cluster] listen to an address of this host that is free",
            ) from None
        server.start()

        def close() -> None:
            server.close()
            service.close()

        return close
