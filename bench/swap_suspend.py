"""Swaps of a pair on one GPU with a plain level-1 sleep against a suspended one (issue 41 item 7).

Each row: a real `dankserve run` (process runtime) supervising two stand-in vLLMs in one swap group on one
GPU, `sleep_level` = "1" or "suspend" (level 1, then the GPU checkpoint of the sleeper's engine core through
the stand-in's checkpoint seam). Each swap is a completion through the gateway for the member asleep; its
seconds are the client's (the request waits for the other's sleep and its own wake), the wake's are the
daemon's own (`status`' swaps: the wake and its canary), and the bytes the sleeper's processes hold asleep
are NVML's (the stand-in's records). Medians of `--repeat` swaps per row, each row in one daemon.

    .venv/bin/python bench/swap_suspend.py [--repeat 6]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import report
from tests.harness.daemon import free_port, process_deployment, running_daemon, write_host

LEVELS = ("1", "suspend")


def measure(level: str, repeat: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ds-bench-suspend-") as scratch:
        host = write_host(Path(scratch) / "host.json")
        env = {"FAKE_VLLM_NVML_DIR": str(host.with_name(host.name + ".processes"))}
        member = {"gpus": [0], "gpu_memory_utilization": 0.9, "swap_group": "g", "sleep_level": level, "env": env}
        gateway = free_port()
        deployments = {n: process_deployment(free_port(), served_model_name=f"m{n}", **member) for n in ("a", "b")}
        globals_ = {"gateway": {"listen": f"127.0.0.1:{gateway}"}}
        with running_daemon(Path(scratch), deployments, hardware=host, extra_globals=globals_) as daemon:
            daemon.wait_for("a", lambda d: d["state"] == "ready", timeout=120)
            daemon.wait_for("b", lambda d: d["state"] == "asleep", timeout=120)
            requests, held = [], []
            for n in range(repeat):
                asleep, awake = ("b", "a") if n % 2 == 0 else ("a", "b")
                status = daemon.deployment(asleep) or {}
                held.append(status.get("gpu_memory_held_bytes") or 0)
                body = {"model": f"m{asleep}", "prompt": "x", "max_tokens": 4}
                begun = time.monotonic()
                answer = httpx.post(f"http://127.0.0.1:{gateway}/v1/completions", json=body, timeout=120)
                requests.append(time.monotonic() - begun)
                assert answer.status_code == 200, answer.text
                daemon.wait_for(awake, lambda d: d["state"] == "asleep", timeout=120)
            swaps = (daemon.status() or {}).get("swaps") or []
            wakes = [s["seconds"] for s in swaps if s["kind"] == "wake" and s["seconds"] is not None]
            sleeps = [s["seconds"] for s in swaps if s["kind"] == "sleep" and s["seconds"] is not None]
            daemon.stop()
    return {
        "sleep_level": level,
        "swap_request_median_s": round(statistics.median(requests), 3),
        "wake_median_s": round(statistics.median(wakes), 4),
        "sleep_median_s": round(statistics.median(sleeps), 4),
        "asleep_held_bytes_median": int(statistics.median(held)),
        "swaps": repeat,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=6)
    args = parser.parse_args()
    rows = [measure(level, args.repeat) for level in LEVELS]
    report("swap_suspend", rows, {"repeat": args.repeat, "vllm": "stand-in (process runtime)"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
