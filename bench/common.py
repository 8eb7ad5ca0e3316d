"""Shared pieces of the benchmark scripts: repeated timing, a printed table, a JSON record.

Each script in bench/ measures one figure against a baseline measured in the same run (the
machines are shared and noisy: compare ratios within one run, not absolute times across runs),
prints a table and writes bench/results/NAME.json.
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).parent / "results"


def time_call(fn: Callable[[], object], repeat: int) -> list[float]:
    """Seconds taken by each of `repeat` calls of fn."""
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def time_command(argv: Sequence[str], repeat: int, env: dict[str, str] | None = None) -> list[float]:
    """Seconds taken by each of `repeat` runs of a whole process; a failing run aborts."""

    def once() -> None:
        done = subprocess.run(argv, capture_output=True, env=env, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.decode()[-500:]}")

    return time_call(once, repeat)


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    import os

    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "ci": bool(os.environ.get("CI")),
    }


def report(name: str, rows: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> Path:
    """Print rows as a table and write them, with the machine, to bench/results/NAME.json."""
    if rows:
        keys = list(rows[0])
        widths = {k: max(len(k), *(len(_cell(r.get(k))) for r in rows)) for k in keys}
        print("  ".join(k.ljust(widths[k]) for k in keys))
        for row in rows:
            print("  ".join(_cell(row.get(k)).ljust(widths[k]) for k in keys))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    payload = {"benchmark": name, "machine": machine(), "rows": rows, **(extra or {})}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {path}")
    return path


def median_ms(samples: Sequence[float]) -> float:
    """The median of samples in seconds, as milliseconds rounded to 0.1."""
    return round(statistics.median(samples) * 1000, 1)


def _cell(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)
