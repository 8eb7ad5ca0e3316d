"""A real Prometheus server (Debian's `prometheus` package) on loopback for end-to-end tests.

It scrapes the given targets every second into a private TSDB in the test's directory; tests
ask its HTTP API (`/api/v1/query`) what it has stored.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.harness.daemon import free_port
from tests.harness.wait import wait_until

SCRAPE_INTERVAL = "1s"


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector of a PromQL expression (its `result` list)."""
        address = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(address, timeout=5) as response:
            document = json.load(response)
        assert document["status"] == "success", document
        result: list[dict[str, Any]] = document["data"]["result"]
        return result

    def value(self, expr: str) -> float | None:
        """The single value of an expression (None when it has no series)."""
        result = self.query(expr)
        return None if not result else float(result[0]["value"][1])

    def wait_value(self, expr: str, expected: float, timeout: float = 60) -> None:
        wait_until(
            lambda: self.value(expr) == expected,
            timeout,
            0.5,
            what=lambda: f"{expr} = {expected} (it is {self.value(expr)}); log:\n{self.log_tail()}",
        )

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])


def prometheus_missing() -> str | None:
    return None if shutil.which("prometheus") else "prometheus is not installed (apt-get install prometheus)"


@contextlib.contextmanager
def prometheus(directory: Path, targets: Sequence[str]) -> Iterator[Prometheus]:
    """Prometheus scraping `targets` (host:port) every second, until the block ends."""
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "prometheus.yml"
    config.write_text(
        "global:\n"
        f"  scrape_interval: {SCRAPE_INTERVAL}\n"
        f"  evaluation_interval: {SCRAPE_INTERVAL}\n"
        "scrape_configs:\n"
        "  - job_name: dankserve\n"
        "    static_configs:\n"
        f"      - targets: {json.dumps(list(targets))}\n"
    )
    port = free_port()
    log = directory / "prometheus.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Prometheus(f"http://127.0.0.1:{port}", process, log)
    try:

        def ready() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"prometheus exited:\n{server.log_tail()}")
            try:
                with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as response:
                    return bool(response.status == 200)
            except OSError:
                return False

        wait_until(ready, 30, 0.2, what=lambda: f"prometheus to start:\n{server.log_tail()}")
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
