"""A local image registry on loopback (Debian's docker-registry) for pull tests and benchmarks."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REGISTRY_BINARY = "/usr/bin/docker-registry"


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def registry_config(storage: Path, port: int) -> str:
    return f"""# Written by the dankserve test harness.
version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""


def _answers(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}/v2/", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@contextmanager
def local_registry(workdir: Path) -> Iterator[str]:
    """A registry serving plain HTTP on a free loopback port; yields `127.0.0.1:PORT`."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_loopback_port()
    config = workdir / "registry.yml"
    config.write_text(registry_config(workdir / "storage", port))
    address = f"127.0.0.1:{port}"
    with (workdir / "registry.log").open("wb") as log_file:
        process = subprocess.Popen(
            [REGISTRY_BINARY, "serve", str(config)], stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 30
        while not _answers(address):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = (workdir / "registry.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"docker-registry did not come up on {address} (exit {process.poll()}):\n{tail}")
            time.sleep(0.1)
        yield address
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
