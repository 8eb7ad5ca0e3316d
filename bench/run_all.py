"""Runs every benchmark that needs no GPU, one after another (`make bench`).

Each script prints its table and writes bench/results/NAME.json; this runner only sequences
them and says which failed. The real-GPU ones are separate: bench/gpu_probe_run.sh and
bench/real_vllm/proof.py (see docs/BENCHMARKS.md).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
SCRIPTS = [
    "probe_timing.py",
    "plan_timing.py",
    "hub_pull.py",
    "bootlog_throughput.py",
    "fake_vllm_image.py",
    "podman_start.py",
    "supervisor_ready.py",
    "supervisor_restart.py",
    "supervisor_footprint.py",
    "supervisor_status.py",
    "gateway_stream.py",
    "metrics_footprint.py",
]


def main() -> int:
    failed = []
    for script in SCRIPTS:
        print(f"\n=== bench/{script}", flush=True)
        done = subprocess.run([sys.executable, str(HERE / script)], cwd=HERE.parent, check=False)
        if done.returncode != 0:
            failed.append(script)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
