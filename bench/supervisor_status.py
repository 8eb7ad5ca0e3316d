"""Whole-process time of `dankserve status --json` while the daemon supervises two ready
deployments, against `python3 -c pass` in the same loop. Target: <= 400 ms.

The daemon and deployments are those of bench/supervisor_footprint.py (Podman runtime by
default). The CLI reads the config, asks the daemon over its control socket, and prints the
JSON; the daemon reads GPU memory and each ready server's /metrics to answer. Runs interleave
with the baseline, after two warm-up runs.

    .venv/bin/python bench/supervisor_status.py [--repeat 21] [--runtime podman|process]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import median_ms, report, time_command
from bench.supervisor_footprint import two_deployments
from bench.supervisor_setup import (
    PodmanStack,
    bench_daemon,
    machine_note,
    podman_stack,
    require_root_harness,
    scratch_dir,
    wait_ready,
)

TARGET_MS = 400.0


def measure(workdir: Path, runtime: str, repeat: int, stack: PodmanStack | None) -> list[dict[str, object]]:
    deployments = two_deployments(runtime, stack, f"{stack.prefix if stack else 'b'}s")
    with bench_daemon(workdir, deployments, stack=stack) as daemon:
        for name in deployments:
            wait_ready(daemon, name)
        status = [str(Path(sys.executable).parent / "dankserve"), "--config", str(daemon.config), "status", "--json"]
        baseline = [sys.executable, "-c", "pass"]
        env = {"PATH": "/usr/bin:/bin"}
        shown = json.loads(subprocess.run(status, capture_output=True, check=True, env=env).stdout)
        if not shown["daemon"]["running"] or any(d["state"] != "ready" for d in shown["deployments"]):
            raise RuntimeError(f"status does not show a running daemon with two ready deployments: {shown}")
        time_command(status, 2, env=env)
        ours: list[float] = []
        base: list[float] = []
        for _ in range(repeat):
            base += time_command(baseline, 1, env=env)
            ours += time_command(status, 1, env=env)
    return [
        {
            "runtime": runtime,
            "command": "python3 -c pass",
            "median_ms": median_ms(base),
            "min_ms": ms(min(base)),
            "stdev_ms": ms(statistics.stdev(base)),
            "ratio": 1.0,
            "ok": True,
        },
        {
            "runtime": runtime,
            "command": "dankserve status --json",
            "median_ms": median_ms(ours),
            "min_ms": ms(min(ours)),
            "stdev_ms": ms(statistics.stdev(ours)),
            "ratio": round(median_ms(ours) / median_ms(base), 2),
            "ok": median_ms(ours) <= TARGET_MS,
        },
    ]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--runtime", choices=["podman", "process"], default="podman")
    args = parser.parse_args()
    require_root_harness()
    with scratch_dir() as tmp:
        workdir = Path(tmp)
        if args.runtime == "podman":
            with podman_stack(workdir / "stack") as stack:
                rows = measure(workdir / "daemon", "podman", args.repeat, stack)
        else:
            rows = measure(workdir / "daemon", "process", args.repeat, None)
    report("supervisor_status", rows, {"repeat": args.repeat, "target_ms": TARGET_MS, **machine_note()})
    return 0 if rows[-1]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
