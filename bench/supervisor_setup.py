"""What the supervisor benchmarks share: the private Podman service with stand-in GPUs and the
stand-in image, deployments of the stand-in, and a real daemon (tests/harness) with a real
NOTIFY_SOCKET.

The Podman pieces are the test harness's (tests/harness): a private `podman system service`
on its own socket and storage, stand-in device nodes named by a uniquely named CDI spec. The
stand-in image is built from this checkout under a tag of its own (BENCH_IMAGE), so a bench run
never swaps the image the tests use. Every container the benchmarks make has a name starting
with `dankserve-b<session>` or carries the session label; `podman_stack` removes them all on
the way out, and the daemon is stopped (SIGTERM, else killed) by `bench_daemon`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.harness.daemon import MODEL_FACTS, RunningDaemon, free_port, process_deployment, running_daemon, write_host
from tests.harness.gpus import StandInGpus, stand_in_gpus
from tests.harness.podman_service import (
    SESSION_LABEL,
    PodmanEnv,
    leftover_containers,
    missing_requirements,
    podman_service,
    remove_containers,
)

REPO = Path(__file__).resolve().parent.parent
BENCH_IMAGE = "localhost/fake-vllm:bench"
TRACE_NAME = "stand-in-trace.log"
# The stand-in's boot, scaled: 116 s on an H200 becomes about 2.3 s cold, 1 s warm.
TIME_SCALE = "0.02"


@dataclass(frozen=True)
class PodmanStack:
    """A running private Podman service, its stand-in GPUs, the stand-in image and a name prefix."""

    env: PodmanEnv
    gpus: StandInGpus
    image: str

    @property
    def prefix(self) -> str:
        """Deployment names of this run start with it (container names: `dankserve-` + it)."""
        return f"b{self.env.session}"

    def uuids(self) -> list[str]:
        return [g.uuid for g in self.gpus.gpus]


def require_root_harness() -> None:
    missing = missing_requirements()
    if missing:
        raise SystemExit(f"cannot run here: missing {', '.join(missing)}")


def build_stand_in(env: PodmanEnv) -> str:
    """The stand-in image of this checkout in the private storage (rebuilt only when it changed)."""
    subprocess.run(
        ["bash", str(REPO / "containers" / "build-image.sh")],
        env={**env.env, "PODMAN": "podman", "FAKE_VLLM_IMAGE": BENCH_IMAGE},
        check=True,
        capture_output=True,
    )
    return BENCH_IMAGE


@contextlib.contextmanager
def podman_stack(workdir: Path) -> Iterator[PodmanStack]:
    """Stand-in GPUs, the private service and the image; every container of the run removed after."""
    with stand_in_gpus(workdir / "gpus", count=2) as gpus, podman_service(workdir / "podman") as env:
        stack = PodmanStack(env, gpus, build_stand_in(env))
        try:
            yield stack
        finally:
            remove_containers(env, leftover_of(stack))


def leftover_of(stack: PodmanStack) -> list[str]:
    """Containers of this run still present (the daemon's by name, the bench's own by label)."""
    env = stack.env
    named = env.podman("ps", "-a", "--filter", f"name=^dankserve-{stack.prefix}", "--format", "{{.Names}}")
    return sorted(set(named.stdout.split()) | set(leftover_containers(env, [f"{SESSION_LABEL}={env.session}"])))


def container_deployment(image: str, port: int, gpu: int, **env: str) -> dict[str, Any]:
    """A Podman deployment of the stand-in image on one stand-in GPU."""
    return {
        "model": "test/tiny",
        "image": image,
        "pull": "never",
        "port": port,
        "gpus": [gpu],
        "env": {"FAKE_VLLM_TIME_SCALE": TIME_SCALE, **env},
        "model_facts": MODEL_FACTS,
    }


def stand_in_process_deployment(port: int, gpu: int, **env: str) -> dict[str, Any]:
    """A process-runtime deployment of the stand-in program on one (recorded) GPU."""
    return process_deployment(port, gpus=[gpu], env={"FAKE_VLLM_TIME_SCALE": TIME_SCALE, **env})


# The product's settings where the test harness shortens them (restart backoff, health period).
PRODUCT_TIMINGS: Mapping[str, Any] = {
    "restart_backoff_initial_seconds": 2.0,
    "restart_jitter_seconds": 1.0,
    "health_interval_seconds": 3.0,
}


@contextlib.contextmanager
def bench_daemon(
    workdir: Path,
    deployments: Mapping[str, Mapping[str, Any]],
    *,
    stack: PodmanStack | None,
    extra_globals: Mapping[str, Any] | None = None,
) -> Iterator[RunningDaemon]:
    """A real daemon (`python -m dankserve run`) for these deployments; stopped afterwards, killed if it hangs."""
    (workdir / "hf").mkdir(parents=True, exist_ok=True)  # the HF cache mount's source (running_daemon's hf_cache_dir)
    uuids = stack.uuids() if stack is not None else None
    hardware = write_host(workdir / "host.json", uuids=uuids)
    globals_ = {**PRODUCT_TIMINGS, **(extra_globals or {})}
    if stack is not None:
        globals_["podman_url"] = stack.env.url
    with running_daemon(workdir, deployments, hardware=hardware, extra_globals=globals_) as daemon:
        try:
            yield daemon
        finally:
            if daemon.proc is not None and daemon.proc.poll() is None:
                try:
                    daemon.stop(timeout=60)
                except subprocess.TimeoutExpired:
                    daemon.kill()


def wait_ready(daemon: RunningDaemon, name: str, timeout: float = 120) -> dict[str, Any]:
    """The deployment's status once ready; a failed deployment stops the benchmark at once."""
    status = daemon.wait_for(name, lambda d: d["state"] in ("ready", "failed"), timeout=timeout)
    if status["state"] == "failed":
        raise RuntimeError(f"{name} failed: {status.get('message')}\n{daemon.log_tail()}")
    return status


def trace_paths(workdir: Path, name: str, runtime: str) -> tuple[Path, str]:
    """The stand-in trace file of a deployment: its host path, and the path the stand-in writes.

    It lies in the deployment's compile-cache directory (`cache_dir`, see running_daemon), which
    the Podman runtime mounts at VLLM_CACHE_ROOT: no extra mount needed.
    """
    from dankserve.planning import CONTAINER_VLLM_CACHE_ROOT

    host_dir = workdir / "cache" / "deployments" / name / "vllm"
    inside = str(host_dir / TRACE_NAME) if runtime == "process" else f"{CONTAINER_VLLM_CACHE_ROOT}/{TRACE_NAME}"
    return host_dir / TRACE_NAME, inside


def traced_at(trace: Path, text: str, timeout: float = 10) -> tuple[float, float]:
    """(monotonic, wall) clock readings of the stand-in's first trace entry holding `text`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            for line in trace.read_text().splitlines():
                monotonic, wall, _stream, written = line.split(" ", 3)
                if text in written:
                    return float(monotonic), float(wall)
        time.sleep(0.05)
    raise RuntimeError(f"{text!r} not in {trace}")


def podman_events(env: PodmanEnv, since: float, until: float, name_prefix: str) -> list[dict[str, Any]]:
    """Container events of containers whose name starts with name_prefix, from Podman's event log."""
    done = env.podman(
        "events",
        "--stream=false",
        "--format",
        "json",
        "--filter",
        "type=container",
        "--since",
        str(int(since) - 1),
        "--until",
        str(int(until) + 2),
    )
    out = []
    for line in done.stdout.splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if str(event.get("Name", "")).startswith(name_prefix):
                out.append(event)
    return out


def event_time(event: Mapping[str, Any]) -> float:
    """An event's Unix time in seconds (Podman 4.3's JSON events carry `Time`, nanoseconds, UTC)."""
    from dankserve.runtime.podman import parse_podman_time

    at = parse_podman_time(str(event["Time"]))
    if at is None:
        raise ValueError(f"event without a time: {event}")
    return at


def scratch_dir() -> tempfile.TemporaryDirectory[str]:
    # /tmp, not the checkout: unix socket paths must stay short.
    return tempfile.TemporaryDirectory(prefix="dankserve-bench-")


def machine_note() -> dict[str, Any]:
    """Load and Podman version beside common.machine(): the figures depend on both here."""
    podman = subprocess.run(["podman", "--version"], capture_output=True, text=True, check=False).stdout.strip()
    return {"loadavg": os.getloadavg(), "podman": podman, "at": time.strftime("%Y-%m-%d %H:%M")}


__all__ = [
    "BENCH_IMAGE",
    "PodmanStack",
    "bench_daemon",
    "container_deployment",
    "event_time",
    "free_port",
    "machine_note",
    "podman_events",
    "podman_stack",
    "require_root_harness",
    "scratch_dir",
    "stand_in_process_deployment",
    "trace_paths",
    "traced_at",
    "wait_ready",
]
