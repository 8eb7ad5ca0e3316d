"""A local image registry on loopback (Debian's docker-registry) for pull tests and benchmarks."""

from __future__ import annotations

import signal
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.harness.wait import wait_until

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

        def log_tail() -> str:
            return (workdir / "registry.log").read_text(errors="replace")[-2000:]

        def answers() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"docker-registry exited {process.poll()} on {address}:\n{log_tail()}")
            return _answers(address)

        wait_until(answers, 30, 0.1, what=lambda: f"docker-registry on {address}:\n{log_tail()}")
        yield address
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
