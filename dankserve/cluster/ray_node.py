"""Ray nodes as process groups: the head on the leader, a worker on each follower.

`ray start --block` stays in the foreground and takes its GCS, raylet and workers down with it,
so one process group per node is the whole node: stopped with SIGTERM to the group, then
SIGKILL. A pid file (pid + start time) lets a restarted daemon remove a node an earlier one
left behind, so a host never runs two nodes of one deployment.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import structlog

from dankserve.processes import is_same_process, spawn_detached, start_time_of, write_private_file

log = structlog.get_logger("dankserve.cluster")

DEFAULT_RAY_PORT = 6379


def ray_executable(configured: str | None) -> str:
    """The `ray` CLI: configured, else next to this Python (the `cluster` extra), else on PATH."""
    if configured:
        return configured
    beside = Path(sys.executable).parent / "ray"
    if beside.exists():
        return str(beside)
    return shutil.which("ray") or "ray"


def ray_temp_dir(state_dir: Path) -> Path:
    """A short per-daemon Ray temp dir: Ray's socket paths must stay under 107 bytes (AF_UNIX),
    and hosts sharing one filesystem (namespaces, test labs) must not share a session dir."""
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"dsray-{digest}"


def _common(node_ip: str, num_gpus: int, temp_dir: Path) -> list[str]:
    return [
        "--block",
        f"--node-ip-address={node_ip}",
        f"--num-gpus={num_gpus}",
        "--num-cpus=1",
        "--disable-usage-stats",
        f"--temp-dir={temp_dir}",
    ]


def head_command(ray: str, node_ip: str, port: int, num_gpus: int, temp_dir: Path) -> list[str]:
    """`ray start --head` declaring this host's GPUs for the group."""
    return [
        ray,
        "start",
        "--head",
        f"--port={port}",
        "--include-dashboard=false",
        *_common(node_ip, num_gpus, temp_dir),
    ]


def worker_command(ray: str, head: str, node_ip: str, num_gpus: int, temp_dir: Path) -> list[str]:
    """`ray start --address HEAD` declaring this host's GPUs."""
    return [ray, "start", f"--address={head}", *_common(node_ip, num_gpus, temp_dir)]


@dataclass(frozen=True)
class NodeRecord:
    pid: int
    create_time: float
    argv: tuple[str, ...]


class RayNode:
    """One Ray node process group, remembered in `directory/NAME.json`."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.name = name
        self._child: subprocess.Popen[bytes] | None = None

    @property
    def _record_path(self) -> Path:
        return self.directory / f"{self.name}.json"

    @property
    def log_path(self) -> Path:
        return self.directory / f"{self.name}.log"

    def _record(self) -> NodeRecord | None:
        try:
            data = json.loads(self._record_path.read_text())
            return NodeRecord(int(data["pid"]), float(data["create_time"]), tuple(data["argv"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def alive(self) -> bool:
        """The node's process (the very one we started) still runs."""
        record = self._record()
        if record is None:
            return False
        if self._child is not None and self._child.pid == record.pid and self._child.poll() is not None:
            return False
        return is_same_process(record.pid, record.create_time, tolerance=1.0)

    def pid(self) -> int | None:
        record = self._record()
        return record.pid if record is not None and self.alive() else None

    def start(self, argv: list[str], env: dict[str, str] | None = None) -> int:
        """Start the node (stopping one left from before); its pid."""
        self.stop()
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        child = spawn_detached(argv, self.log_path, env={**os.environ, **(env or {})}, append=True)
        self._child = child
        create_time = start_time_of(child.pid)
        write_private_file(self._record_path, json.dumps({"pid": child.pid, "create_time": create_time, "argv": argv}))
        log.info("ray_node_started", node=self.name, pid=child.pid, argv=" ".join(argv))
        return child.pid

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM to the group, SIGKILL after `timeout`; a node already gone is fine."""
        record = self._record()
        if record is not None and self.alive():
            log.info("ray_node_stopping", node=self.name, pid=record.pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(record.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self._group_alive(record.pid):
                self._reap()
                time.sleep(0.1)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(record.pid, signal.SIGKILL)
        self._reap()
        with contextlib.suppress(FileNotFoundError):
            self._record_path.unlink()

    def _reap(self) -> None:
        if self._child is not None and self._child.poll() is not None:
            self._child = None

    @staticmethod
    def _group_alive(pgid: int) -> bool:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        for proc in psutil.process_iter(["pid"]):
            with contextlib.suppress(psutil.Error):
                if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                    return True
        return False


# Run with the Python that has Ray: waits until the cluster shows N live nodes and G GPUs.
WAIT_SCRIPT = """
import json, sys, time
import ray
address, nodes, gpus, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
ray.init(address=address, logging_level="ERROR", log_to_driver=False)
deadline = time.time() + timeout
while True:
    alive = [n for n in ray.nodes() if n.get("Alive")]
    total = sum(n.get("Resources", {}).get("GPU", 0) for n in alive)
    seen = [{"address": n["NodeManagerAddress"], "gpus": n.get("Resources", {}).get("GPU", 0)} for n in alive]
    if (len(alive) >= nodes and total >= gpus) or time.time() > deadline:
        print(json.dumps({"nodes": seen, "gpus": total}))
        sys.exit(0 if len(alive) >= nodes and total >= gpus else 1)
    time.sleep(0.5)
"""


def ray_python(ray: str) -> str:
    """The Python beside the `ray` CLI (a venv's bin), else this one."""
    beside = Path(ray).parent / "python"
    return str(beside) if beside.exists() else sys.executable


def wait_for_cluster(ray: str, address: str, nodes: int, gpus: int, timeout: float) -> tuple[bool, str]:
    """Whether Ray reports `nodes` live nodes with `gpus` GPUs in all within `timeout`; what it saw."""
    try:
        done = subprocess.run(
            [ray_python(ray), "-c", WAIT_SCRIPT, address, str(nodes), str(gpus), str(timeout)],
            capture_output=True,
            text=True,
            timeout=timeout + 30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False, f"no answer from the Ray cluster at {address} within {timeout:.0f}s"
    lines = done.stdout.strip().splitlines()
    return done.returncode == 0, lines[-1] if lines else done.stderr.strip()[-500:]
