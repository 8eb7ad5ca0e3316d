"""Whole-process time of `dankserve plan --json --hardware FILE --model M` against `python3 -c pass`.

Both run in the same loop, interleaved, so a noisy machine slows both alike; the figure that
matters is the plan's median (target: under 300 ms) and its ratio to a bare interpreter start.

    .venv/bin/python bench/plan_timing.py [--repeat 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import median_ms, report, time_command

REPO = Path(__file__).resolve().parent.parent
HOST = REPO / "tests" / "hosts" / "plan-h100-80gb-x1-64gb.json"
TARGET_MS = 300.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=15)
    options = parser.parse_args()
    dankserve = str(Path(sys.executable).parent / "dankserve")
    plan = [dankserve, "plan", "--json", "--hardware", str(HOST), "--model", "Qwen/Qwen3-30B-A3B"]
    baseline = [sys.executable, "-c", "pass"]
    env = {"PATH": "/usr/bin:/bin"}  # no DANKSERVE_*: no config file (the default path is absent)
    time_command(plan, 2, env=env)  # warm the page cache and .pyc files
    plan_samples: list[float] = []
    base_samples: list[float] = []
    for _ in range(options.repeat):
        base_samples += time_command(baseline, 1, env=env)
        plan_samples += time_command(plan, 1, env=env)
    plan_ms, base_ms = median_ms(plan_samples), median_ms(base_samples)
    rows = [
        {"command": "python3 -c pass", "median_ms": base_ms, "min_ms": round(min(base_samples) * 1000, 1)},
        {
            "command": "dankserve plan --json --hardware ... --model ...",
            "median_ms": plan_ms,
            "min_ms": round(min(plan_samples) * 1000, 1),
        },
    ]
    ratio = round(plan_ms / base_ms, 2)
    report(
        "plan_timing",
        rows,
        extra={
            "repeat": options.repeat,
            "ratio": ratio,
            "target_ms": TARGET_MS,
            "stdev_ms": round(statistics.stdev(plan_samples) * 1000, 1),
            "at": time.strftime("%Y-%m-%d"),
        },
    )
    verdict = "under" if plan_ms < TARGET_MS else "OVER"
    print(
        f"plan median {plan_ms} ms = {ratio} x python3 -c pass ({base_ms} ms): {verdict} the {TARGET_MS:.0f} ms target"
    )


if __name__ == "__main__":
    main()
