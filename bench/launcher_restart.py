"""Restarts with the launcher against plain restarts: the stand-in vLLM imitating vLLM's import time.

Real `vllm serve` spends most of a warm restart in Python: the API server imports torch and vLLM
(17.4 s on the H200) and its spawned engine core imports them again (17-19 s); engine init is
about 7.5 s (FACTS.md, "Start-up time, measured"). The stand-in's timeline has no import of its
own; `FAKE_VLLM_IMPORT_SECONDS` adds one (docs/stand-in-vllm.md): once when its CLI is imported,
once more at the engine core's start unless `VLLM_WORKER_MULTIPROC_METHOD=fork`. The launcher
pays the first ahead of time and forks the engine core, so only the engine's own work is left.

Each row: a real `dankserve run` (process runtime) and the time from the event (the server killed
with SIGKILL; `down` then `up`; a reload changing max_num_seqs) to the new boot ready (/health 200
and status ready). The ratio is the launcher's median over the plain restart's median after a kill
(the manual best's stand-in) and over the plain restart of the same kind (a config change profiles
memory again either way: max_num_seqs is part of the learning key). Medians of `--repeat` runs.

    .venv/bin/python bench/launcher_restart.py [--repeat 3] [--import-seconds 1.74] [--time-scale 0.1]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import report
from dankserve.runtime.launcher_client import LauncherClient
from dankserve.testing.config_file import write_config
from tests.harness.daemon import RunningDaemon, free_port, launcher_deployment, process_deployment, running_daemon

NAME = "chat"


def ready_after(boots: int) -> Callable[[dict[str, Any]], bool]:
    return lambda d: d["state"] == "ready" and d["boots"] > boots


def kill_server(daemon: RunningDaemon, launcher: bool) -> None:
    if launcher:
        server = LauncherClient(daemon.state_dir / "launchers" / NAME).status().server
        assert server is not None
        os.killpg(server.pid, signal.SIGKILL)
    else:
        pid = json.loads((daemon.state_dir / "processes" / f"{NAME}.json").read_text())["pid"]
        os.killpg(pid, signal.SIGKILL)


def down_up(daemon: RunningDaemon) -> None:
    daemon.request({"command": "down", "deployment": NAME})
    daemon.request({"command": "up", "deployment": NAME})


def reload_with(daemon: RunningDaemon, dep: dict[str, Any]) -> None:
    globals_text = daemon.config.read_text().split("[deployments.", 1)[0]
    write_config(daemon.config, {}, {NAME: dep})
    daemon.config.write_text(globals_text + daemon.config.read_text())
    daemon.signal(signal.SIGHUP)


def measure(kind: str, launcher: bool, repeat: int, env: dict[str, str]) -> list[float]:
    """Seconds from the event to the next boot ready, `repeat` times in one daemon."""
    port = free_port()
    make = launcher_deployment if launcher else process_deployment
    seconds = []
    with tempfile.TemporaryDirectory(prefix="ds-bench-launcher-") as scratch:
        globals_ = {"failure_window_seconds": 1}  # each kill is the first in its window: no backoff
        with running_daemon(Path(scratch), {NAME: make(port, env=env)}, extra_globals=globals_) as daemon:
            status = daemon.wait_for(NAME, lambda d: d["state"] == "ready", timeout=300)
            for i in range(repeat):
                boots = status["boots"]
                time.sleep(1.5)  # past the failure window
                begun = time.monotonic()
                if kind == "kill":
                    kill_server(daemon, launcher)
                elif kind == "down-up":
                    down_up(daemon)
                else:
                    reload_with(daemon, make(port, env=env, max_num_seqs=16 + i))
                status = daemon.wait_for(NAME, ready_after(boots), timeout=300)
                seconds.append(time.monotonic() - begun)
            daemon.stop()
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--import-seconds", type=float, default=1.74, help="the stand-in's import (17.4 s x scale)")
    parser.add_argument("--time-scale", type=float, default=0.1, help="FAKE_VLLM_TIME_SCALE")
    args = parser.parse_args()
    env = {"FAKE_VLLM_IMPORT_SECONDS": str(args.import_seconds), "FAKE_VLLM_TIME_SCALE": str(args.time_scale)}
    rows = []
    plain: dict[str, float] = {}
    for kind in ("kill", "down-up", "config-change"):
        for launcher in (False, True):
            samples = measure(kind, launcher, args.repeat, env)
            median = statistics.median(samples)
            if not launcher:
                plain[kind] = median
            rows.append(
                {
                    "kind": f"{'launcher' if launcher else 'plain'}-{kind}",
                    "runtime": "process",
                    "median_s": round(median, 3),
                    "runs_s": [round(s, 3) for s in samples],
                    "ratio_to_plain": round(median / plain[kind], 2),
                    "ratio_to_plain_kill": round(median / plain["kill"], 2),
                }
            )
    report("launcher_restart", rows, {"import_seconds": args.import_seconds, "time_scale": args.time_scale})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
