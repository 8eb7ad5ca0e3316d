"""Restarts through a snapshot's restore against a launcher boot and a plain boot (issue 41).

Each row: a real `dankserve run` (process runtime) supervising the stand-in vLLM with a 20 s boot
(`FAKE_VLLM_BOOT_SECONDS`; its import `FAKE_VLLM_IMPORT_SECONDS`, which the launcher saves, is added
on top), its server killed with SIGKILL, and the time from the kill to the first streamed token of a
completion sent to the server's port (retried until it connects). `restore`: `snapshot = "auto"` (the
ready server was captured once; every restart restores it with real CRIU and the stand-in's GPU
checkpoint); `launcher`: `launcher = true`, snapshots off; `plain`: neither. The ratio is each
median over the launcher's. Medians of `--repeat` kills per row, each in one daemon.

    sudo .venv/bin/python bench/snapshot_restore.py [--repeat 5] [--boot-seconds 20] [--import-seconds 0]

Needs root and CRIU >= 4.2 (`make system-deps`) for the restore row.
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
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import report
from dankserve.runtime.launcher_client import LauncherClient
from tests.harness.daemon import (
    RunningDaemon,
    free_port,
    launcher_deployment,
    process_deployment,
    running_daemon,
    write_host,
)

NAME = "chat"
MODES = ("restore", "launcher", "plain")


def server_pid(daemon: RunningDaemon, mode: str) -> int:
    if mode == "launcher":
        server = LauncherClient(daemon.state_dir / "launchers" / NAME).status().server
        assert server is not None
        return server.pid
    pid: int = json.loads((daemon.state_dir / "processes" / f"{NAME}.json").read_text())["pid"]
    return pid


def first_token(port: int, deadline: float) -> None:
    """Until a streamed completion's first token arrives from the server on `port`."""
    body = {"model": "test/tiny", "prompt": "x", "max_tokens": 4, "stream": True}
    while time.monotonic() < deadline:
        try:
            with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=30) as answer:
                if answer.status_code == 200:
                    for line in answer.iter_lines():
                        if line.startswith("data:") and '"text"' in line:
                            return
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    raise TimeoutError("no token before the deadline")


def deployment(mode: str, host: Path, port: int, env: dict[str, str]) -> dict[str, Any]:
    nvml = {"FAKE_VLLM_NVML_DIR": str(host.with_name(host.name + ".processes")), **env}
    extra: dict[str, Any] = {"gpus": [0], "listen": "tcp"}
    if mode == "launcher":
        return launcher_deployment(port, env=nvml, **extra)
    return process_deployment(port, env=nvml, snapshot="auto" if mode == "restore" else "off", **extra)


def measure(mode: str, repeat: int, env: dict[str, str]) -> list[float]:
    """Seconds from each kill to the first token, `repeat` times in one daemon."""
    port = free_port()
    seconds = []
    with tempfile.TemporaryDirectory(prefix="ds-bench-snapshot-") as scratch:
        host = write_host(Path(scratch) / "host.json")
        globals_ = {"failure_window_seconds": 1}  # each kill is the first in its window: no backoff
        dep = deployment(mode, host, port, env)
        with running_daemon(Path(scratch), {NAME: dep}, hardware=host, extra_globals=globals_) as daemon:

            def settled(d: dict[str, Any]) -> bool:
                return d["state"] == "ready" and (mode != "restore" or d["snapshot"]["state"] == "ready")

            daemon.wait_for(NAME, settled, timeout=600)
            for _ in range(repeat):
                time.sleep(1.5)  # past the failure window
                pid = server_pid(daemon, mode)
                begun = time.monotonic()
                os.killpg(pid, signal.SIGKILL)
                time.sleep(0.05)  # the old server's socket closes with it
                first_token(port, begun + 600)
                seconds.append(time.monotonic() - begun)
                daemon.wait_for(NAME, settled, timeout=600)
            kinds = (daemon.deployment(NAME) or {}).get("boots_by_kind")
            print(f"{mode}: boots by kind {kinds}", file=sys.stderr)
            daemon.stop()
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--boot-seconds", type=float, default=20.0, help="FAKE_VLLM_BOOT_SECONDS")
    parser.add_argument("--import-seconds", type=float, default=0.0, help="FAKE_VLLM_IMPORT_SECONDS")
    parser.add_argument("--modes", default=",".join(MODES), help="which rows, comma-separated")
    args = parser.parse_args()
    env = {"FAKE_VLLM_BOOT_SECONDS": str(args.boot_seconds), "FAKE_VLLM_IMPORT_SECONDS": str(args.import_seconds)}
    medians: dict[str, float] = {}
    samples: dict[str, list[float]] = {}
    for mode in args.modes.split(","):
        samples[mode] = measure(mode, args.repeat, env)
        medians[mode] = statistics.median(samples[mode])
    base = medians.get("launcher")
    rows = [
        {
            "restart": mode,
            "median_s": round(medians[mode], 3),
            "runs_s": [round(s, 3) for s in samples[mode]],
            "ratio_to_launcher": round(medians[mode] / base, 3) if base else None,
        }
        for mode in samples
    ]
    extra = {"boot_seconds": args.boot_seconds, "import_seconds": args.import_seconds, "repeat": args.repeat}
    report("snapshot_restore", rows, extra)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
