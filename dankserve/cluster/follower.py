"""The follower's side of the API: report this host, start and stop the Ray worker of a group.

One Ray worker per deployment; a new start-worker replaces the old one (a leader that restarted
rebuilds its group from scratch), so a follower never serves two groups of one deployment.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog

from dankserve.cluster.api import split_address
from dankserve.cluster.per_host import free_memory_report, node_env
from dankserve.cluster.ray_node import RayNode, ray_executable, ray_temp_dir, worker_command
from dankserve.host.gpu_memory import GpuMemory
from dankserve.host.model import Host
from dankserve.settings import ClusterSettings

log = structlog.get_logger("dankserve.cluster")

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_HEAD = re.compile(r"^[A-Za-z0-9.\-\[\]:]{1,100}:\d{1,5}$")


class FollowerService:
    """Implements the ClusterHandler protocol for this daemon."""

    def __init__(
        self,
        cluster: ClusterSettings,
        state_dir: Path,
        host: Callable[[], Host],
        gpu_memory: Callable[[tuple[str, ...]], Mapping[str, GpuMemory]] | None = None,
        cache_root: Callable[[str], Path] | None = None,
    ) -> None:
        self.cluster = cluster
        self.node_ip = split_address(cluster.listen, 0)[0]
        self.directory = state_dir / "ray"
        self._host = host
        self._gpu_memory = gpu_memory
        self._cache_root = cache_root
        self._nodes: dict[str, RayNode] = {}
        self._heads: dict[str, str] = {}
        self._lock = threading.Lock()
        """Start and stop requests arrive on concurrent API threads (a leader retrying after a timeout):
        one at a time, so a worker is never started twice and one of them left behind."""

    def _node(self, deployment: str) -> RayNode:
        return self._nodes.setdefault(deployment, RayNode(self.directory, f"worker-{deployment}"))

    def status(self) -> dict[str, Any]:
        workers = {}
        for name, node in self._nodes.items():
            workers[name] = {"running": node.alive(), "pid": node.pid(), "head": self._heads.get(name)}
        host = self._host()
        readings = self._gpu_memory(tuple(g.uuid for g in host.gpus)) if self._gpu_memory is not None else {}
        return {
            "ok": True,
            "address": self.cluster.listen,
            "host": host.model_dump(mode="json"),
            "gpu_memory": free_memory_report({uuid: r.free_bytes for uuid, r in readings.items()}),
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
        env: dict[str, str] = {}
        if self._cache_root is not None:
            # This host's compile cache, for the vLLM workers Ray places here.
            root = self._cache_root(deployment)
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
            env = node_env(str(root))
        log.info("ray_worker_start", deployment=deployment, head=head, num_gpus=gpus, env=env)
        with self._lock:
            pid = node.start(argv, env)
            self._heads[deployment] = head
        return {"ok": True, "pid": pid}

    def stop_worker(self, request: Mapping[str, Any]) -> dict[str, Any]:
        deployment = request.get("deployment")
        if not isinstance(deployment, str) or not _NAME.match(deployment):
            return {"ok": False, "error": f"bad deployment name {deployment!r}"}
        log.info("ray_worker_stop", deployment=deployment)
        with self._lock:
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
