"""/metrics with four deployments: scrape time, and the daemon's CPU and RSS with metrics on and a
scrape every 5 s against the same daemon set-up without metrics, in one run.

Targets: a scrape at or under 20 ms (median), the daemon at or under 1 % CPU (of one core) and
90 MB RSS with metrics on.

Both daemons (`python -m dankserve run`, product timings: /health every 3 s, vLLM's /metrics read
every 5 s in the background) supervise four ready deployments of the stand-in, two per stand-in
GPU. With metrics on, `--scrapes` scrapes back to back give the scrape time (each a fresh HTTP
connection, as Prometheus's would be after a keep-alive timeout); then a window of `--seconds`
with one scrape every 5 s gives CPU (user+system time over the window) and RSS (sampled every
second). The daemon without metrics gets the same window without scrapes.

    .venv/bin/python bench/metrics_footprint.py [--seconds 60] [--scrapes 200] [--runtime process|podman]
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.request
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import median_ms, report, time_call
from bench.supervisor_footprint import sample
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

SCRAPE_TARGET_MS = 20.0
RSS_TARGET_MB = 90.0
CPU_TARGET_PERCENT = 1.0
SCRAPE_EVERY_SECONDS = 5.0
SETTLE_SECONDS = 8.0
DEPLOYMENTS = 4


def four_deployments(runtime: str, stack: PodmanStack | None, prefix: str) -> dict[str, dict[str, Any]]:
    """Four deployments sharing the two stand-in GPUs (a fifth of each GPU apiece)."""
    out = {}
    for i in range(DEPLOYMENTS):
        gpu = i % 2
        if runtime == "process":
            dep = stand_in_process_deployment(free_port(), gpu)
        else:
            assert stack is not None
            dep = container_deployment(stack.image, free_port(), gpu)
        out[f"{prefix}{i}"] = {**dep, "gpu_memory_utilization": 0.2}
    return out


def scrape(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        body: bytes = response.read()
        return body


def window(pid: int, seconds: float, url: str | None) -> dict[str, Any]:
    """CPU and RSS over `seconds`; with a URL, scraped every SCRAPE_EVERY_SECONDS meanwhile."""
    import threading

    stop = threading.Event()

    def scraper() -> None:
        while url is not None and not stop.wait(SCRAPE_EVERY_SECONDS):
            scrape(url)

    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    try:
        return sample(pid, seconds)
    finally:
        stop.set()
        thread.join()


def measure(
    workdir: Path, runtime: str, stack: PodmanStack | None, metrics: bool, args: argparse.Namespace
) -> dict[str, Any]:
    listen = f"127.0.0.1:{free_port()}" if metrics else None
    deployments = four_deployments(runtime, stack, f"{stack.prefix if stack else 'b'}{'m' if metrics else 'n'}")
    extra = {"metrics_listen": listen} if listen else {}
    with bench_daemon(workdir, deployments, stack=stack, extra_globals=extra) as daemon:
        for name in deployments:
            wait_ready(daemon, name)
        time.sleep(SETTLE_SECONDS)  # the observatory has read every server's /metrics by now
        assert daemon.proc is not None
        row: dict[str, Any] = {
            "runtime": runtime,
            "metrics": "on" if metrics else "off",
            "deployments": len(deployments),
        }
        url = f"http://{listen}/metrics" if listen else None
        if url is not None:
            body = scrape(url)
            relayed = body.count(b"vllm:num_requests_running{")
            if relayed != DEPLOYMENTS:
                raise RuntimeError(f"the scrape relays {relayed} deployments' vLLM metrics, not {DEPLOYMENTS}")
            times = time_call(lambda: scrape(url), args.scrapes)
            row.update(
                scrape_ms_median=median_ms(times),
                scrape_ms_p95=round(sorted(times)[int(0.95 * len(times)) - 1] * 1000, 1),
                scrape_bytes=len(body),
            )
        figures = window(daemon.proc.pid, args.seconds, url)
        row.update(figures)
        states = [daemon.deployment(name) for name in deployments]
        if not all(s is not None and s["state"] == "ready" for s in states):
            raise RuntimeError(f"a deployment left ready during the window: {states}")
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each CPU/RSS window (default 60)")
    parser.add_argument("--scrapes", type=int, default=200, help="back-to-back scrapes timed (default 200)")
    parser.add_argument("--runtime", choices=["process", "podman"], default="process")
    args = parser.parse_args()
    require_root_harness()
    with scratch_dir() as tmp:
        workdir = Path(tmp)
        stack_cm: AbstractContextManager[PodmanStack | None] = (
            podman_stack(workdir / "stack") if args.runtime == "podman" else nullcontext(None)
        )
        with stack_cm as stack:
            on = measure(workdir / "on", args.runtime, stack, True, args)
            off = measure(workdir / "off", args.runtime, stack, False, args)
    rows = [on, off]
    ok = (
        on["scrape_ms_median"] <= SCRAPE_TARGET_MS
        and on["cpu_percent"] <= CPU_TARGET_PERCENT
        and on["rss_mb_max"] <= RSS_TARGET_MB
    )
    extra = {
        "seconds": args.seconds,
        "scrapes": args.scrapes,
        "scrape_target_ms": SCRAPE_TARGET_MS,
        "rss_target_mb": RSS_TARGET_MB,
        "cpu_target_percent": CPU_TARGET_PERCENT,
        "cpu_added_percent": round(on["cpu_percent"] - off["cpu_percent"], 2),
        "rss_added_mb": round(on["rss_mb_max"] - off["rss_mb_max"], 1),
        "ok": ok,
        **machine_note(),
    }
    report("metrics_footprint", rows, extra)
    print(f"ok: {ok} (metrics on adds {extra['cpu_added_percent']} % CPU, {extra['rss_added_mb']} MB RSS)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
