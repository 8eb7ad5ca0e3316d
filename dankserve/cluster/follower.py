"""The follower's side of the API: report this host, start and stop the Ray worker of a group.

One Ray worker per deployment; a new start-worker replaces the old one (a leader that restarted
rebuilds its group from scratch), so a follower never serves two groups of one deployment.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog

from dankserve.cluster.api import split_address
from dankserve.cluster.ray_node import RayNode, ray_executable, ray_temp_dir, worker_command
from dankserve.host.model import Host
from dankserve.settings import ClusterSettings

log = structlog.get_logger("dankserve.cluster")

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_HEAD = re.compile(r"^[A-Za-z0-9.\-\[\]:]{1,100}:\d{1,5}$")


class FollowerService:
    """Implements the ClusterHandler protocol for this daemon."""

    def __init__(self, cluster: ClusterSettings, state_dir: Path, host: Callable[[], Host]) -> None:
        self.cluster = cluster
        self.node_ip = split_address(cluster.listen, 0)[0]
        self.directory = state_dir / "ray"
        self._host = host
        self._nodes: dict[str, RayNode] = {}
        self._heads: dict[str, str] = {}

    def _node(self, deployment: str) -> RayNode:
        return self._nodes.setdefault(deployment, RayNode(self.directory, f"worker-{deployment}"))

    def status(self) -> dict[str, Any]:
        workers = {}
        for name, node in self._nodes.items():
            workers[name] = {"running": node.alive(), "pid": node.pid(), "head": self._heads.get(name)}
        return {
            "ok": True,
            "address": self.cluster.listen,
            "host": self._host().model_dump(mode="json"),
            "workers": workers,
        }

    def start_worker(self, request: Mapping[str, Any]) -> dict[str, Any]:
        deployment, head, gpus = request.get("deployment"), request.get("head"), request.get("num_gpus")
        if not isinstance(deployment, str) or not _NAME.match(deployment):
            return {"ok": False, "error": f"bad deployment name {deployment!r}"}
        if not isinstance(head, str) or not _HEAD.match(head):
            return {"ok": False, "error": f"bad head address {head!r} (HOST:PORT)"}
        if not isinstance(gpus, int) or not 1 <= gpus <= 64:
            return {"ok": False, "error": f"bad num_gpus {gpus!r}"}
        node = self._node(deployment)
        argv = worker_command(
            ray_executable(self.cluster.ray_executable), head, self.node_ip, gpus, ray_temp_dir(self.directory)
        )
        log.info("ray_worker_start", deployment=deployment, head=head, num_gpus=gpus)
        pid = node.start(argv)
        self._heads[deployment] = head
        return {"ok": True, "pid": pid}

    def stop_worker(self, request: Mapping[str, Any]) -> dict[str, Any]:
        deployment = request.get("deployment")
        if not isinstance(deployment, str) or not _NAME.match(deployment):
            return {"ok": False, "error": f"bad deployment name {deployment!r}"}
        log.info("ray_worker_stop", deployment=deployment)
        self._node(deployment).stop()
        self._heads.pop(deployment, None)
        return {"ok": True}

    def remove_stale(self) -> None:
        """Stop workers an earlier daemon on this host left running (their leader rebuilds the group)."""
        for record in sorted(self.directory.glob("worker-*.json")):
            deployment = record.stem.removeprefix("worker-")
            self._node(deployment).stop()

    def close(self) -> None:
        """Stop every worker (the daemon is stopping)."""
        for node in self._nodes.values():
            node.stop()
