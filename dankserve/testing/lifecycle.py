"""A fake `Runtime` and a fake clock for in-process tests of the lifecycle (the worker and its machine).

`FakeRuntime` sits at the narrow Runtime seam, in the spirit of httpx's `MockTransport`: a
handler says how each started workload behaves (`FakeBoot`: the log lines it prints, whether it
exits and with what, whether /health answers), and every call is recorded in `calls`.
`FakeClock` is a monotonic and a wall clock that only move when the worker waits with nothing
to do: a boot timeout of half an hour passes in milliseconds. Nothing here sleeps on wall time;
the worker's log followers are threads, so a wait first lets them hand over what they have.

The real-Podman and process end-to-end tests stay the tests of the runtimes themselves.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TypeVar

from dankserve.errors import PodmanUnreachable
from dankserve.runtime.base import (
    LABEL_DEPLOYMENT,
    LABEL_MANAGED,
    ExitEvent,
    ImageInfo,
    PullPolicy,
    PullProgress,
    Runtime,
    Workload,
    WorkloadSpec,
    workload_name,
)
from dankserve.supervisor.machine import HealthChecked

T = TypeVar("T")

VERSION_LINE = "INFO 03-14 09:12:30 [api_server.py:1043] vLLM API server version 0.8.5"
LOADED_LINE = "(EngineCore pid=3) INFO 11-29 18:00:12 [default_loader.py:507] Loading weights took 0.40 seconds"
READY_LINE = "(APIServer pid=1) INFO:     Application startup complete."
OOM_LINE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of "
    "139.81 GiB of which 1.02 GiB is free."
)


def kv_suggestion_line(kv_bytes: int) -> str:
    """vLLM's line suggesting `--kv-cache-memory=<kv_bytes>` after profiling (what boot learning reads)."""
    return (
        "(EngineCore pid=3) INFO 11-29 18:00:48 [gpu_worker.py:1065] Free memory on device (139.27/139.81 GiB) "
        "on startup. Desired GPU memory utilization is (0.92, 128.63 GiB). Actual usage is 2.31 GiB for consumed "
        "memory (weights + non-torch), 1.15 GiB for peak activation, and 0.52 GiB for CUDAGraph memory. Replace "
        f"gpu_memory_utilization config with `--kv-cache-memory={kv_bytes}` (123.43 GiB) to fit into requested "
        "memory, or `--kv-cache-memory=144070307840` (134.17 GiB) to fully utilize gpu memory. Current kv cache "
        "memory in use is 121.67 GiB."
    )


def serving_lines(kv_bytes: int = 132530194268) -> tuple[str, ...]:
    """A boot that loads, profiles (suggesting `kv_bytes`) and becomes ready."""
    return (VERSION_LINE, LOADED_LINE, kv_suggestion_line(kv_bytes), READY_LINE)


@dataclass(frozen=True)
class FakeBoot:
    """How one started workload behaves."""

    lines: tuple[str, ...] = field(default_factory=serving_lines)
    exit_code: int | None = None
    """Exits with this code after printing its lines (None: keeps running until stopped)."""
    healthy: bool = True
    """/health answers 200 while it runs (False: 503, vLLM's dead engine)."""
    oom_killed: bool = False


Handler = Callable[[WorkloadSpec, int], FakeBoot]
"""Says how the n-th started workload (1, 2, ...) of a spec behaves."""


@dataclass
class _Running:
    workload: Workload
    boot: FakeBoot
    ended: threading.Event = field(default_factory=threading.Event)
    exit_code: int | None = None


class FakeRuntime(Runtime):
    """A Runtime whose workloads are scripted; records every call as (method, argument) in `calls`."""

    def __init__(self, handler: Handler | None = None, *, vllm_version: str = "0.8.5") -> None:
        self.handler: Handler = handler or (lambda spec, n: FakeBoot())
        self.vllm_version = vllm_version
        self.calls: list[tuple[str, str]] = []
        self.specs: list[WorkloadSpec] = []
        self.unreachable = False
        """While True, every call raises PodmanUnreachable (a Podman outage)."""
        self._lock = threading.Lock()
        self._workloads: dict[str, _Running] = {}
        self._ids = itertools.count(1)
        self._started = 0

    def _call(self, method: str, argument: str = "") -> None:
        with self._lock:
            self.calls.append((method, argument))
        if self.unreachable:
            raise PodmanUnreachable("the fake runtime is unreachable", fix="end the outage")

    def called(self, method: str) -> list[str]:
        """The arguments of every call of `method`, in order."""
        with self._lock:
            return [argument for name, argument in self.calls if name == method]

    # -- the Runtime interface ----------------------------------------------------------------------
    def ensure_image(
        self, image: str, pull: PullPolicy, progress: Callable[[PullProgress], None] | None = None
    ) -> ImageInfo:
        self._call("ensure_image", image)
        return ImageInfo(image, "sha256:fake", self.vllm_version)

    def start(self, spec: WorkloadSpec) -> Workload:
        self._call("start", spec.deployment)
        with self._lock:
            self._started += 1
            number = self._started
            self.specs.append(spec)
            wid = f"fake-{next(self._ids)}"
            workload = Workload(
                wid,
                workload_name(spec.deployment),
                spec.deployment,
                "running",
                {**spec.labels, LABEL_MANAGED: "true", LABEL_DEPLOYMENT: spec.deployment},
            )
            running = _Running(workload, self.handler(spec, number))
            self._workloads[wid] = running
        if running.boot.exit_code is not None:
            self._end(wid, running.boot.exit_code)
        return workload

    def run_existing(self, deployment: str, fingerprint: str, boot: FakeBoot | None = None) -> str:
        """A workload left running by an earlier daemon (for adoption tests); its id."""
        with self._lock:
            wid = f"fake-{next(self._ids)}"
            labels = {LABEL_MANAGED: "true", LABEL_DEPLOYMENT: deployment, "io.dankserve.fingerprint": fingerprint}
            workload = Workload(wid, workload_name(deployment), deployment, "running", labels)
            self._workloads[wid] = _Running(workload, boot or FakeBoot())
        return wid

    def _end(self, wid: str, code: int | None) -> None:
        with self._lock:
            running = self._workloads.get(wid)
            if running is None or running.ended.is_set():
                return
            running.exit_code = code
            running.ended.set()

    def crash(self, wid: str, code: int = 137) -> None:
        """The workload dies (as if killed)."""
        self._end(wid, code)

    def sicken(self, wid: str) -> None:
        """The workload's engine dies while its process runs: /health answers 503 from now on."""
        with self._lock:
            running = self._workloads[wid]
            self._workloads[wid] = _Running(
                running.workload, replace(running.boot, healthy=False), running.ended, running.exit_code
            )

    def stop(self, workload_id: str, timeout: float) -> None:
        self._call("stop", workload_id)
        self._end(workload_id, 0)

    def remove(self, workload_id: str) -> None:
        self._call("remove", workload_id)
        with self._lock:
            running = self._workloads.pop(workload_id, None)
        if running is not None:
            running.ended.set()

    def logs(self, workload_id: str, follow: bool = False) -> Iterator[str]:
        self._call("logs", workload_id)
        with self._lock:
            running = self._workloads.get(workload_id)
        if running is None:
            return
        yield from running.boot.lines
        if follow:
            running.ended.wait()  # waits for the worker's own stop or a scripted end, not for time

    def wait(self, workload_id: str, timeout: float | None = None) -> ExitEvent | None:
        self._call("wait", workload_id)
        with self._lock:
            running = self._workloads.get(workload_id)
        if running is None:
            return ExitEvent(workload_id, "", None)
        if not running.ended.is_set():
            return None  # in fake time a wait times out at once
        return ExitEvent(workload_id, running.workload.deployment, running.exit_code, running.boot.oom_killed)

    def find(self, deployment: str) -> Workload | None:
        self._call("find", deployment)
        with self._lock:
            for running in self._workloads.values():
                if running.workload.deployment == deployment:
                    return self._now(running)
        return None

    def rename(self, workload_id: str, deployment: str) -> bool:
        """The workload takes `deployment`'s name (an upgrade's trial handed over); its labels stay."""
        self._call("rename", f"{workload_id} {deployment}")
        with self._lock:
            running = self._workloads[workload_id]
            w = running.workload
            moved = replace(w, name=workload_name(deployment), deployment=deployment)
            self._workloads[workload_id] = replace(running, workload=moved)
        return True

    def list_workloads(self) -> list[Workload]:
        self._call("list_workloads")
        with self._lock:
            return [self._now(r) for r in self._workloads.values()]

    def inspect(self, workload_id: str) -> Workload | None:
        self._call("inspect", workload_id)
        with self._lock:
            running = self._workloads.get(workload_id)
            return self._now(running) if running is not None else None

    @staticmethod
    def _now(running: _Running) -> Workload:
        if not running.ended.is_set():
            return running.workload
        w = running.workload
        return Workload(w.id, w.name, w.deployment, "exited", w.labels, exit_code=running.exit_code)

    # -- what the server would answer -------------------------------------------------------------------
    def running(self, deployment: str) -> str | None:
        """The id of the deployment's running workload, if any."""
        with self._lock:
            for wid, running in self._workloads.items():
                if running.workload.deployment == deployment and not running.ended.is_set():
                    return wid
        return None

    def health(self, deployment: str) -> HealthChecked:
        """/health of the deployment's server: 200, 503 (dead engine), or nothing listening."""
        wid = self.running(deployment)
        if wid is None:
            return HealthChecked(None, "ConnectionRefusedError: nothing listens")
        with self._lock:
            healthy = self._workloads[wid].boot.healthy
        return HealthChecked(200 if healthy else 503)


class FakeClock:
    """Monotonic and wall time that move only when the worker waits with nothing to do."""

    GRACE_SECONDS = 0.02
    """How long a wait lets other threads (log followers, the test) hand something over first."""

    def __init__(self, start: float = 1000.0, wall_offset: float = 1_700_000_000.0) -> None:
        self._now = start
        self._offset = wall_offset
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def time(self) -> float:
        return self.monotonic() + self._offset

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    def wait(self, inbox: queue.Queue[T], timeout: float | None) -> T | None:
        try:
            return inbox.get(timeout=self.GRACE_SECONDS if timeout is not None else None)
        except queue.Empty:
            pass
        assert timeout is not None
        self.advance(timeout)
        return None
