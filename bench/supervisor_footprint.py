"""The daemon's footprint supervising two ready deployments: RSS and CPU of its process over a
window (default 60 s). Targets: <= 80 MB RSS and <= 1 % CPU (of one core).

The daemon (`python -m dankserve run`, product timings: /health every 3 s) supervises two
deployments of the stand-in, one per stand-in GPU. Once both are ready and a settling pause has
passed, psutil samples the daemon's process (not its children: with the process runtime the
servers are its children) every second: RSS each time, CPU as the change of its user+system
time over the whole window divided by the window's length.

    .venv/bin/python bench/supervisor_footprint.py [--seconds 60] [--runtime podman|process|both]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import report
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
    wait_ready,
)

RSS_TARGET_MB = 80.0
CPU_TARGET_PERCENT = 1.0
SETTLE_SECONDS = 5.0
MB = 1_000_000


def two_deployments(runtime: str, stack: PodmanStack | None, prefix: str) -> dict[str, dict[str, Any]]:
    if runtime == "process":
        return {f"{prefix}{i}": stand_in_process_deployment(free_port(), i) for i in range(2)}
    assert stack is not None
    return {f"{prefix}{i}": container_deployment(stack.image, free_port(), i) for i in range(2)}


def sample(pid: int, seconds: float) -> dict[str, Any]:
    """RSS samples and CPU share of the process over `seconds`."""
    import psutil

    proc = psutil.Process(pid)
    rss = []
    start_cpu = proc.cpu_times()
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        rss.append(proc.memory_info().rss)
        time.sleep(1.0)
    end_cpu = proc.cpu_times()
    wall = time.monotonic() - start
    used = (end_cpu.user - start_cpu.user) + (end_cpu.system - start_cpu.system)
    rss.append(proc.memory_info().rss)
    return {
        "rss_mb_max": round(max(rss) / MB, 1),
        "rss_mb_last": round(rss[-1] / MB, 1),
        "uss_mb": round(proc.memory_full_info().uss / MB, 1),
        "threads": proc.num_threads(),
        "cpu_percent": round(100 * used / wall, 2),
        "cpu_seconds": round(used, 3),
        "window_s": round(wall, 1),
    }


def measure(workdir: Path, runtime: str, seconds: float, stack: PodmanStack | None) -> dict[str, Any]:
    deployments = two_deployments(runtime, stack, f"{stack.prefix if stack else 'b'}f")
    with bench_daemon(workdir, deployments, stack=stack) as daemon:
        for name in deployments:
            wait_ready(daemon, name)
        time.sleep(SETTLE_SECONDS)
        assert daemon.proc is not None
        figures = sample(daemon.proc.pid, seconds)
        states = [daemon.deployment(name) for name in deployments]
        if not all(s is not None and s["state"] == "ready" for s in states):
            raise RuntimeError(f"a deployment left ready during the window: {states}")
    row = {"runtime": runtime, "deployments": len(deployments), **figures}
    row["ok"] = figures["rss_mb_max"] <= RSS_TARGET_MB and figures["cpu_percent"] <= CPU_TARGET_PERCENT
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the sampled window (default 60)")
    parser.add_argument("--runtime", choices=["podman", "process", "both"], default="both")
    args = parser.parse_args()
    require_root_harness()
    rows = []
    with scratch_dir() as tmp:
        workdir = Path(tmp)
        if args.runtime in ("podman", "both"):
            with podman_stack(workdir / "stack") as stack:
                rows.append(measure(workdir / "podman", "podman", args.seconds, stack))
        if args.runtime in ("process", "both"):
            rows.append(measure(workdir / "process", "process", args.seconds, None))
    extra = {"seconds": args.seconds, "rss_target_mb": RSS_TARGET_MB, "cpu_target_percent": CPU_TARGET_PERCENT}
    report("supervisor_footprint", rows, {**extra, **machine_note()})
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
