"""The leader's side of a group: a Runtime that wraps the deployment's own runtime.

start: tear down anything left (workers first, then the head), start the Ray head, ask every
follower to start its worker, wait until Ray reports every node and GPU, then start vLLM with
RAY_ADDRESS. While it runs, a monitor polls each follower; a member lost (its worker gone, or no
answer twice, about 4 s) is reported to the supervisor (`watch_members`: the worker feeds its
machine a `MemberLost` with the reason, which reaches `last_failure`), and the supervisor stops
and restarts the whole group with its usual backoff and failure policy. stop: vLLM, then the
workers, then the head. A group left by an earlier daemon is never adopted (its monitor is gone):
`adoptable()` says so, the supervisor replaces it, and never two groups run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from dankserve.cluster.api import ClusterClient, split_address
from dankserve.cluster.per_host import NON_CARRY_OVER_FILE, node_env, non_carry_over
from dankserve.cluster.ray_node import RayNode, head_command, ray_temp_dir, wait_for_cluster
from dankserve.errors import GroupNotFormed, MemberUnreachable
from dankserve.runtime.base import (
    ExitEvent,
    ImageInfo,
    PullPolicy,
    PullProgress,
    Runtime,
    Workload,
    WorkloadSpec,
)

log = structlog.get_logger("dankserve.cluster")

POLL_SECONDS = 2.0
MISSES_BEFORE_LOST = 2
CLUSTER_WAIT_SECONDS = 90.0


@dataclass
class MemberView:
    """What `status` shows of one host of the group."""

    address: str
    role: str
    state: str = "unknown"
    message: str | None = None
    checked_at: float | None = None


@dataclass
class GroupConfig:
    """What a group runtime needs to know: its members and this host's Ray settings."""

    followers: tuple[ClusterClient, ...]
    node_ip: str
    ray: str
    ray_port: int
    state_dir: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    cache_root: Callable[[str], Path] | None = None
    """This host's compile cache dir of a deployment (VLLM_CACHE_ROOT of the head's workers)."""


class GroupRuntime(Runtime):
    """A Runtime for a multi-host deployment (implements dankserve.runtime.base.Runtime)."""

    def __init__(self, inner: Runtime, config: GroupConfig) -> None:
        self.inner = inner
        self.config = config
        self.deployment: str | None = None
        self._head: RayNode | None = None
        self._monitor_stop = threading.Event()
        self._monitor: threading.Thread | None = None
        self._lock = threading.Lock()
        self.members: list[MemberView] = [MemberView(f"{config.node_ip} (this host)", "leader")] + [
            MemberView(c.address, "follower") for c in config.followers
        ]
        self.lost: str | None = None
        self._on_lost: Callable[[str], None] | None = None

    # -- group lifecycle ----------------------------------------------------------------------------
    @property
    def head_address(self) -> str:
        return f"{self.config.node_ip}:{self.config.ray_port}"

    def _head_node(self, deployment: str) -> RayNode:
        if self._head is None:
            self._head = RayNode(self.config.state_dir, f"head-{deployment}")
        return self._head

    def _set_member(self, index: int, state: str, message: str | None = None) -> None:
        with self._lock:
            member = self.members[index]
            member.state, member.message, member.checked_at = state, message, time.time()

    def teardown(self, deployment: str) -> None:
        """Workers first, then the head: nothing of an earlier group survives."""
        self._stop_monitor()
        for i, client in enumerate(self.config.followers, start=1):
            try:
                client.stop_worker({"deployment": deployment})
                self._set_member(i, "stopped")
            except MemberUnreachable as exc:
                self._set_member(i, "unreachable", str(exc))
                log.warning("group_member_unreachable", deployment=deployment, member=client.address, error=str(exc))
        self._head_node(deployment).stop()
        self._set_member(0, "stopped")

    def form(self, deployment: str, gpus_per_host: int) -> None:
        """Start the head and every worker; return once Ray reports every node and GPU."""
        self.teardown(deployment)
        self.lost = None
        cfg = self.config
        head = self._head_node(deployment)
        env: dict[str, str] = {}
        if cfg.cache_root is not None:
            root = cfg.cache_root(deployment)
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
            env = node_env(str(root))
        argv = head_command(cfg.ray, cfg.node_ip, cfg.ray_port, gpus_per_host, ray_temp_dir(cfg.state_dir))
        head.start(argv, env)
        self._set_member(0, "starting")
        nodes = 1 + len(cfg.followers)
        try:
            for i, client in enumerate(cfg.followers, start=1):
                client.start_worker({"deployment": deployment, "head": self.head_address, "num_gpus": gpus_per_host})
                self._set_member(i, "starting")
            ok, seen = wait_for_cluster(cfg.ray, self.head_address, nodes, nodes * gpus_per_host, CLUSTER_WAIT_SECONDS)
            if not ok:
                raise GroupNotFormed(f"Ray did not report {nodes} nodes with {nodes * gpus_per_host} GPUs: {seen}")
        except BaseException:
            # Half a group serves nobody: leave none behind (a worker left would join the next head).
            self.teardown(deployment)
            raise
        log.info("group_formed", deployment=deployment, ray=seen)
        for i in range(nodes):
            self._set_member(i, "joined")

    def vllm_config_root(self, deployment: str) -> Path:
        """vLLM's config dir for the group's driver, holding the list of variables it must not copy into
        the Ray workers (VLLM_CACHE_ROOT: each host's workers keep their own compile cache)."""
        root = self.config.state_dir / f"vllm-config-{deployment}"
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        (root / NON_CARRY_OVER_FILE).write_text(non_carry_over() + "\n")
        return root

    # -- the monitor ----------------------------------------------------------------------------------
    def _start_monitor(self, deployment: str, workload_id: str) -> None:
        self._monitor_stop = threading.Event()
        stop = self._monitor_stop
        thread = threading.Thread(
            target=self._watch, args=(deployment, workload_id, stop), name=f"group-{deployment}", daemon=True
        )
        self._monitor = thread
        thread.start()

    def _stop_monitor(self) -> None:
        self._monitor_stop.set()
        thread = self._monitor
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
        self._monitor = None

    def _watch(self, deployment: str, workload_id: str, stop: threading.Event) -> None:
        misses = [0] * len(self.config.followers)
        while not stop.wait(POLL_SECONDS):
            reason = None
            if not self._head_node(deployment).alive():
                reason = "the Ray head on this host exited"
                self._set_member(0, "lost", reason)
            for i, client in enumerate(self.config.followers):
                try:
                    answer = client.status()
                except MemberUnreachable as exc:
                    misses[i] += 1
                    self._set_member(i + 1, "unreachable", f"{misses[i]} missed: {exc}")
                    if misses[i] >= MISSES_BEFORE_LOST:
                        reason = f"{client.address} did not answer {misses[i]} times"
                    continue
                except Exception as exc:
                    reason = f"{client.address}: {exc}"
                    continue
                misses[i] = 0
                worker = answer.get("workers", {}).get(deployment) or {}
                if worker.get("running"):
                    self._set_member(i + 1, "joined")
                else:
                    reason = f"the Ray worker on {client.address} is gone"
                    self._set_member(i + 1, "lost", reason)
            if reason is not None and not stop.is_set():
                self.lost = reason
                log.error("group_member_lost", deployment=deployment, reason=reason)
                listener = self._on_lost
                if listener is not None:
                    listener(reason)  # the supervisor decides: it stops and restarts the whole group
                else:  # nobody listens: ending vLLM ends the boot or serve loop all the same
                    self.inner.stop(workload_id, 10.0)
                return

    # -- the Runtime interface ------------------------------------------------------------------------
    def ensure_image(
        self, image: str, pull: PullPolicy, progress: Callable[[PullProgress], None] | None = None
    ) -> ImageInfo:
        return self.inner.ensure_image(image, pull, progress)

    def start(self, spec: WorkloadSpec) -> Workload:
        self.deployment = spec.deployment
        self.form(spec.deployment, max(1, len(spec.gpus)))
        env = {
            "VLLM_CONFIG_ROOT": str(self.vllm_config_root(spec.deployment)),
            **spec.env,
            **self.config.extra_env,
            "RAY_ADDRESS": self.head_address,
            "VLLM_HOST_IP": self.config.node_ip,
        }
        workload = self.inner.start(replace(spec, env=env))
        self._start_monitor(spec.deployment, workload.id)
        return workload

    def stop(self, workload_id: str, timeout: float) -> None:
        self._stop_monitor()
        self.inner.stop(workload_id, timeout)
        deployment = self.deployment or _deployment_of(self.inner.inspect(workload_id))
        if deployment is not None:
            self.teardown(deployment)

    def remove(self, workload_id: str) -> None:
        self.inner.remove(workload_id)

    def logs(self, workload_id: str, follow: bool = False) -> Iterator[str]:
        return self.inner.logs(workload_id, follow)

    def wait(self, workload_id: str, timeout: float | None = None) -> ExitEvent | None:
        return self.inner.wait(workload_id, timeout)

    def find(self, deployment: str) -> Workload | None:
        self.deployment = deployment
        return self.inner.find(deployment)

    def adoptable(self) -> bool:
        """Whether a running workload may be adopted: only while this runtime watches its group (a group
        left by an earlier daemon has no monitor, so the supervisor replaces it)."""
        return self._monitor is not None

    def watch_members(self, on_lost: Callable[[str], None]) -> None:
        """Report a lost member to `on_lost(reason)` instead of stopping vLLM here."""
        self._on_lost = on_lost

    def list_workloads(self) -> list[Workload]:
        return self.inner.list_workloads()

    def inspect(self, workload_id: str) -> Workload | None:
        return self.inner.inspect(workload_id)

    # -- status ------------------------------------------------------------------------------------------
    def hosts(self) -> list[dict[str, Any]]:
        """Every host of the group as `status` shows it."""
        with self._lock:
            return [
                {"address": m.address, "role": m.role, "state": m.state, "message": m.message} for m in self.members
            ]


def _deployment_of(workload: Workload | None) -> str | None:
    return workload.deployment if workload is not None else None


def node_ip_of(listen: str) -> str:
    return split_address(listen, 0)[0]
