"""The daemon's CPU with the web console open (issue 43): a real daemon (subprocess) with its gateway
and two stand-in servers (process runtime, one swap group), its CPU seconds (/proc/PID/stat: user +
system) over a window with no page open, then with N pages of /ui/ open in one headless Chromium
(each on the Deployments page: it follows the status pushed every 2 s). Per round both windows; figures: the
median over rounds, as CPU percent of one core (compare the two columns of one run: the box is shared).

    .venv/bin/python bench/console_cpu.py [--pages 5] [--window 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import report
from tests.harness.browser import Browser
from tests.harness.daemon import free_port, process_deployment, running_daemon

MEMBER = {"gpus": [0], "gpu_memory_utilization": 0.9, "swap_group": "g", "sleep_level": "1"}
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


async def window(pid: int, seconds: float) -> float:
    """The daemon's CPU percent of one core over `seconds`."""
    start, began = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(seconds)
    return 100 * (cpu_seconds(pid) - start) / (time.monotonic() - began)


async def measure(pid: int, url: str, pages: int, seconds: float) -> tuple[float, float]:
    idle = await window(pid, seconds)
    async with Browser() as browser:
        await browser.goto(url + "/ui/")
        for _ in range(pages - 1):
            await browser.send("Target.createTarget", url=url + "/ui/")
        await asyncio.sleep(3)  # every page loaded and polling
        busy = await window(pid, seconds)
    return idle, busy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", type=int, default=5)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    gateway = free_port()
    deployments = {
        "a": process_deployment(free_port(), served_model_name="ma", **MEMBER),
        "b": process_deployment(free_port(), served_model_name="mb", **MEMBER),
    }
    settings = {"gateway": {"listen": f"127.0.0.1:{gateway}"}}
    with tempfile.TemporaryDirectory() as tmp, running_daemon(Path(tmp), deployments, extra_globals=settings) as d:
        d.wait_for("a", lambda s: s["state"] == "ready", timeout=60)
        assert d.proc is not None
        runs = [
            asyncio.run(measure(d.proc.pid, f"http://127.0.0.1:{gateway}", args.pages, args.window))
            for _ in range(args.rounds)
        ]
    idle = statistics.median(r[0] for r in runs)
    busy = statistics.median(r[1] for r in runs)
    rows = [
        {"pages": 0, "daemon_cpu_percent": round(idle, 2)},
        {"pages": args.pages, "daemon_cpu_percent": round(busy, 2)},
    ]
    report("console_cpu", rows, {"window_seconds": args.window, "rounds": [list(r) for r in runs]})


if __name__ == "__main__":
    main()
