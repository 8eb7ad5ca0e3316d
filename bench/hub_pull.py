"""Pull throughput: `dankserve.hub.pull` (huggingface_hub's client) against `curl` of the same file,
both from a stand-in Hub over loopback, both writing to the same disk.

One repo with one weight file of SIZE MiB (real bytes, not sparse). Each round pulls it into a
fresh HF cache (everything `dankserve pull` does: the file list, the disk check, the metadata
HEAD, the download, the cache layout) and fetches the same CDN URL with `curl -o`; interleaved,
medians over the rounds. Target: pull at 0.9x curl or better.

    .venv/bin/python bench/hub_pull.py [--size-mib 1024] [--repeat 5]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import report
from dankserve.hub.access import hub_access
from dankserve.hub.pull import pull
from dankserve.testing.hub import StandInHub
from tests.harness.hub import small_repo

MIB = 1 << 20
TARGET_RATIO = 0.9
REPO_ID = "bench/pull"


def serve(root: Path, size: int, ready: multiprocessing.Queue[tuple[str, int]]) -> None:
    """The stand-in Hub with one repo, until killed."""
    hub = StandInHub(root)
    small_repo(hub, REPO_ID, size)
    url = hub.start()
    ready.put((url, sum(f.size for f in hub.repos[REPO_ID].files.values() if not f.path.endswith(".bin"))))
    threading.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=5)
    options = parser.parse_args()
    size: int = options.size_mib * MIB
    with tempfile.TemporaryDirectory(prefix="dankserve-bench-pull-", dir="/var/tmp") as scratch:
        root = Path(scratch)
        # the Hub in a process of its own: in this one it would share the GIL with the pull, not with curl
        ready: multiprocessing.Queue[tuple[str, int]] = multiprocessing.get_context("spawn").Queue()
        server = multiprocessing.get_context("spawn").Process(
            target=serve, args=(root / "hub", size, ready), daemon=True
        )
        server.start()
        endpoint, total = ready.get(timeout=120)
        url = f"{endpoint.replace('127.0.0.1', 'localhost')}/cdn/{REPO_ID}/model.safetensors"
        pull_rates: list[float] = []
        curl_rates: list[float] = []
        try:
            for i in range(-1, options.repeat):  # round -1 warms the page cache and the server: not counted

                def with_curl(i: int = i) -> float:
                    target = root / f"curl-{i}"
                    start = time.perf_counter()
                    subprocess.run(["curl", "-sS", "-f", "-o", str(target), url], check=True)
                    rate = size / (time.perf_counter() - start)
                    target.unlink()
                    return rate

                def with_pull(i: int = i) -> float:
                    access = hub_access(root / f"hf-{i}", root / f"state-{i}", "bench", None, {"HF_ENDPOINT": endpoint})
                    start = time.perf_counter()
                    result = pull(access, REPO_ID, None)
                    rate = total / (time.perf_counter() - start)
                    assert result.fetched_bytes == total
                    shutil.rmtree(root / f"hf-{i}")
                    return rate

                # alternate who goes first, and let the disk write back between runs: each starts clean
                order = [(curl_rates, with_curl), (pull_rates, with_pull)]
                for rates, measure in order if i % 2 else reversed(order):
                    os.sync()
                    rate = measure()
                    if i >= 0:
                        rates.append(rate)
        finally:
            server.kill()
            server.join()
    pull_mib, curl_mib = statistics.median(pull_rates) / MIB, statistics.median(curl_rates) / MIB
    ratio = round(pull_mib / curl_mib, 2)
    rows = [
        {
            "client": "curl -o FILE (the CDN URL)",
            "median_mib_s": round(curl_mib, 1),
            "max_mib_s": round(max(curl_rates) / MIB, 1),
        },
        {
            "client": "dankserve pull (huggingface_hub)",
            "median_mib_s": round(pull_mib, 1),
            "max_mib_s": round(max(pull_rates) / MIB, 1),
        },
    ]
    report(
        "hub_pull",
        rows,
        extra={
            "size_mib": options.size_mib,
            "repeat": options.repeat,
            "ratio": ratio,
            "target_ratio": TARGET_RATIO,
            "curl_mib_s": [round(r / MIB, 1) for r in curl_rates],
            "pull_mib_s": [round(r / MIB, 1) for r in pull_rates],
        },
    )
    verdict = "at or above" if ratio >= TARGET_RATIO else "BELOW"
    print(f"pull {pull_mib:.0f} MiB/s = {ratio} x curl ({curl_mib:.0f} MiB/s): {verdict} the {TARGET_RATIO} target")


if __name__ == "__main__":
    main()
