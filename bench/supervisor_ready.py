"""READY=1 latency: from the stand-in writing `Application startup complete.` to READY=1 arriving
on the daemon's NOTIFY_SOCKET. Target: median <= 100 ms.

Each run starts a fresh daemon (`python -m dankserve run`, as systemd would) with one deployment
of the stand-in on a real datagram NOTIFY_SOCKET (tests/harness/daemon.py), so READY=1 is sent
once per run. The two clock readings:

- the line: the stand-in itself notes when it wrote it (FAKE_VLLM_TRACE_FILE: the wall clock
  read right after the write+flush of the record returned; the container shares the host's
  clock). Watching the log file from outside would add the watcher's own polling delay.
- READY=1: the wall clock when the harness's receiving thread got the datagram.

Between them: the runtime's log path (process: the daemon reads the log file; Podman: conmon
writes the k8s-file log, the service's `logs?follow=true` stream), the boot-log reader, one
/health request, the phase change, and the main loop's sd_notify. The daemon's own JSON log
gives the split (`ready` = the worker decided, `daemon_ready` = the main loop sent READY=1).

    .venv/bin/python bench/supervisor_ready.py [--repeat 11] [--runtime process|podman|both]

Root, Podman 4.3, the test harness's private service (see bench/supervisor_setup.py).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import median_ms, report
from bench.supervisor_setup import (
    PodmanStack,
    bench_daemon,
    container_deployment,
    free_port,
    machine_note,
    podman_stack,
    require_root_harness,
    scratch_dir,
    stand_in_process_deployment,
    trace_paths,
    traced_at,
    wait_ready,
)
from dankserve.runtime.base import workload_name

LINE = "Application startup complete."
TARGET_MS = 100.0
PARTS = ("line_to_conmon", "line_to_podman_api", "line_to_worker_ready", "worker_ready_to_notify")


def log_time(events: list[dict[str, Any]], event: str) -> float | None:
    """Wall time of the daemon's first JSON log event named `event`."""
    for item in events:
        if item.get("event") == event and "timestamp" in item:
            return datetime.fromisoformat(str(item["timestamp"]).replace("Z", "+00:00")).timestamp()
    return None


class LogFollower:
    """A second reader of the container's log through Podman's own follow stream (podman-py, the
    API path the daemon used before it read local k8s-file logs itself), noting when the line
    arrives there; and conmon's timestamp of the line from the k8s-file log."""

    def __init__(self, stack: PodmanStack, name: str) -> None:
        from podman import PodmanClient

        self._client = PodmanClient(base_url=stack.env.url)
        self._stack = stack
        self._container = workload_name(name)
        self.arrived: float | None = None
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        from podman.errors import NotFound

        from dankserve.runtime.podman import split_lines

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the daemon creates the container
            try:
                container = self._client.containers.get(self._container)
                break
            except NotFound:
                time.sleep(0.02)
        else:
            return
        frames = cast(Iterator[bytes], container.logs(stream=True, follow=True, stdout=True, stderr=True))
        for line in split_lines(frames):
            if LINE in line:
                self.arrived = time.time()
                return

    def conmon_stamp(self) -> float | None:
        """When conmon wrote the line to the k8s-file log (its timestamp field)."""
        from dankserve.runtime.podman import parse_podman_time

        inspected = json.loads(self._stack.env.podman("container", "inspect", self._container).stdout)[0]
        path = inspected.get("LogPath") or inspected["HostConfig"]["LogConfig"]["Path"]
        for raw in Path(path).read_text(errors="replace").splitlines():
            if LINE in raw:
                return parse_podman_time(raw.split(" ", 1)[0])
        return None

    def close(self) -> None:
        self._thread.join(timeout=5)
        self._client.close()  # type: ignore[no-untyped-call]


def one_run(workdir: Path, runtime: str, index: int, stack: PodmanStack | None) -> dict[str, float]:
    """Seconds from the line to READY=1, and to the points between (NaN where not measured)."""
    name = f"{stack.prefix if stack else 'b'}r{index}"
    host_trace, inside = trace_paths(workdir, name, runtime)
    # A boot length of its own per run (reproducible): where the line falls relative to any
    # periodic poll on the log path (Podman's follow polls every 250 ms) must vary between runs,
    # or every run hits the same point of that period and the median says nothing.
    boot_seconds = random.Random(index).uniform(1.0, 2.0)
    env = {"FAKE_VLLM_TRACE_FILE": inside, "FAKE_VLLM_BOOT_SECONDS": f"{boot_seconds:.3f}"}
    if runtime == "process":
        deployment = stand_in_process_deployment(free_port(), 0, **env)
    else:
        assert stack is not None
        deployment = container_deployment(stack.image, free_port(), 0, **env)
    nan = float("nan")
    conmon_at = api_at = None
    with bench_daemon(workdir, {name: deployment}, stack=stack) as daemon:
        follower = LogFollower(stack, name) if stack is not None else None
        wait_ready(daemon, name)
        ready_at = None
        for _ in range(100):
            ready_at = daemon.notifications.first("READY=1")
            if ready_at is not None:
                break
            time.sleep(0.05)
        if ready_at is None:
            raise RuntimeError(f"no READY=1:\n{daemon.log_tail()}")
        _, line_at = traced_at(host_trace, LINE)
        if follower is not None:
            follower.close()
            conmon_at, api_at = follower.conmon_stamp(), follower.arrived
        events = daemon.events()
    worker_ready = log_time(events, "ready")
    return {
        "line_to_notify": ready_at - line_at,
        "line_to_conmon": conmon_at - line_at if conmon_at else nan,
        "line_to_podman_api": api_at - line_at if api_at else nan,
        "line_to_worker_ready": worker_ready - line_at if worker_ready else nan,
        "worker_ready_to_notify": ready_at - worker_ready if worker_ready else nan,
    }


def median_measured(samples: list[float]) -> float | None:
    """The median in ms of the samples that were measured (NaN: not for this runtime)."""
    measured = [x for x in samples if not math.isnan(x)]
    return median_ms(measured) if measured else None


def measure(workdir: Path, runtime: str, repeat: int, stack: PodmanStack | None) -> dict[str, Any]:
    runs = [one_run(workdir / f"{runtime}-{i}", runtime, i, stack) for i in range(repeat)]
    total = [r["line_to_notify"] for r in runs]
    print(f"{runtime}: " + ", ".join(f"{s * 1000:.0f}" for s in total) + " ms", flush=True)
    return {
        "runtime": runtime,
        "runs": repeat,
        "median_ms": median_ms(total),
        "min_ms": round(min(total) * 1000, 1),
        "max_ms": round(max(total) * 1000, 1),
        "stdev_ms": round(statistics.stdev(total) * 1000, 1) if len(total) > 1 else 0.0,
        **{f"{part}_ms": median_measured([r[part] for r in runs]) for part in PARTS},
        "target_ms": TARGET_MS,
        "ok": median_ms(total) <= TARGET_MS,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=11, help="daemon starts per runtime (default 11)")
    parser.add_argument("--runtime", choices=["process", "podman", "both"], default="both")
    args = parser.parse_args()
    require_root_harness()
    rows = []
    with scratch_dir() as tmp:
        workdir = Path(tmp)
        if args.runtime in ("process", "both"):
            rows.append(measure(workdir, "process", args.repeat, None))
        if args.runtime in ("podman", "both"):
            with podman_stack(workdir / "stack") as stack:
                rows.append(measure(workdir, "podman", args.repeat, stack))
    report("supervisor_ready", rows, {"repeat": args.repeat, "line": LINE, **machine_note()})
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
