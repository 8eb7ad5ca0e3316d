"""The private Podman service of the tests: shipped as dankserve.testing.podman_service (the demo
uses it too); re-exported here under the names the tests and benchmarks import, plus a service
the fault-injection tests stop and start, and the tests' own clean-up (leftover secrets, pulled images)."""

import os
import signal
import subprocess
from pathlib import Path

from dankserve.testing.podman_service import (
    REQUIRED_TOOLS,
    SESSION_LABEL,
    PodmanEnv,
    _ping,
    containers_conf,
    leftover_containers,
    missing_requirements,
    podman_service,
    registries_conf,
    remove_containers,
    run_root,
    storage_conf,
    storage_root,
)
from tests.harness.wait import wait_until

__all__ = [
    "REQUIRED_TOOLS",
    "SESSION_LABEL",
    "PodmanEnv",
    "RestartableService",
    "containers_conf",
    "leftover_containers",
    "leftover_secrets",
    "missing_requirements",
    "podman_service",
    "registries_conf",
    "remove_containers",
    "remove_images_from",
    "run_root",
    "storage_conf",
    "storage_root",
]


class RestartableService:
    """A second `podman system service` on the same storage and configuration as `env`, on a socket of its
    own, that a test may stop and start again (the fault: the Podman service goes away and comes back).

    Containers outlive the service (conmon keeps them), as under systemd's podman.service.
    """

    def __init__(self, env: PodmanEnv, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.env = env
        self.socket = workdir / "podman.sock"
        self.url = f"unix://{self.socket}"
        self.log = workdir / "service.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 60) -> None:
        with self.log.open("ab") as log_file:
            self._process = subprocess.Popen(
                ["podman", "system", "service", "--time=0", self.url],
                env=dict(self.env.env),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        process = self._process

        def answers() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"podman system service exited:\n{self.log.read_text()[-2000:]}")
            return self.socket.exists() and _ping(self.socket)

        wait_until(answers, timeout, 0.1, what=lambda: f"podman system service:\n{self.log.read_text()[-2000:]}")

    def pause(self) -> None:
        """SIGSTOP the service: its socket still accepts connections, and no request is answered (a hung Podman)."""
        assert self._process is not None
        os.killpg(self._process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT the service: it answers again, the requests that waited first."""
        if self._process is not None and self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGCONT)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the service (SIGTERM: graceful; SIGKILL: gone at once) and remove its socket."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.send_signal(sig)
            try:
                self._process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None
        self.socket.unlink(missing_ok=True)


def leftover_secrets(env: PodmanEnv, prefix: str) -> list[str]:
    """Names of Podman secrets starting with prefix."""
    done = env.podman("secret", "ls", "--format", "{{.Name}}")
    return sorted(name for name in done.stdout.split() if name.startswith(prefix))


def remove_images_from(env: PodmanEnv, registry: str) -> None:
    """Remove the local copies of images pulled from a registry (the tests' pulls)."""
    done = env.podman("images", "--format", "{{.Repository}}:{{.Tag}}")
    pulled = [ref for ref in done.stdout.split() if ref.startswith(f"{registry}/")]
    if pulled:
        env.podman("rmi", "--force", *pulled, check=False)
