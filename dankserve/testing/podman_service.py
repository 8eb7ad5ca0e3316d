"""A private `podman system service` with a containers.conf of its own; the host's stays untouched.

Used by the tests (tests/conftest.py), the benchmarks and `make demo`. Each user names its
storage (`purpose`: "tests", "demo"): a private graph root that persists between runs (built
images are slow to make, so they are cached there), default `~/.cache/dankserve-<purpose>/podman`,
overridable with DANKSERVE_<PURPOSE>_PODMAN_ROOT (DANKSERVE_TEST_PODMAN_ROOT for the tests). The
run root and libpod's tmp dir live under /run (cleared at boot, as Podman expects) at a path
derived from the graph root, because libpod refuses a graph root whose recorded run paths
changed. File locks (not the host-wide SHM lock segment) keep this libpod instance from ever
touching the host's Podman state. The host's own containers and images are invisible here, and
what runs here is invisible to the host's Podman.

Every `podman` command line runs with `PodmanEnv.env`, so the CLI and the service see the same
storage and configuration.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SESSION_LABEL = "io.dankserve.test-session"
"""Every container a test or benchmark makes carries this label with its session id."""

REQUIRED_TOOLS = ("podman", "runc", "conmon", "docker-registry", "busybox")
"""What the tests' harness needs (the demo needs less: see dankserve/demo.py)."""
STAND_IN_REF = "localhost/fake-vllm:latest"
"""The stand-in vLLM image that `make fake-vllm-image` (containers/build-image.sh) builds."""
REPO = Path(__file__).resolve().parents[2]


def missing_requirements(tools: Sequence[str] = REQUIRED_TOOLS) -> list[str]:
    """What keeps a private Podman service with stand-in GPUs from running here (empty when it can)."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if os.geteuid() != 0:
        missing.append("root (mknod, /etc/cdi and rootful Podman)")
    return missing


def storage_root(purpose: str = "tests") -> Path:
    """The persistent graph root of the private storage for `purpose` ("tests", "demo")."""
    variable = "DANKSERVE_TEST_PODMAN_ROOT" if purpose == "tests" else f"DANKSERVE_{purpose.upper()}_PODMAN_ROOT"
    configured = os.environ.get(variable)
    if configured:
        return Path(configured)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / f"dankserve-{purpose}" / "podman"


def run_root(graph_root: Path, purpose: str = "tests") -> Path:
    """The run-time state directory that belongs to a graph root."""
    digest = hashlib.sha256(str(graph_root.resolve()).encode()).hexdigest()[:12]
    return Path(f"/run/dankserve-{purpose}") / digest


def containers_conf(tmp_dir: Path, events_log: Path) -> str:
    """The private containers.conf (FACTS.md: runc and ulimits within a Debian 12 machine's limits)."""
    return f"""# Written by dankserve.testing for its private Podman service.
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
log_driver = "k8s-file"

[engine]
runtime = "runc"
lock_type = "file"
tmp_dir = "{tmp_dir}"
events_logger = "file"
events_logfile_path = "{events_log}"
"""


def storage_conf(graph_root: Path, state_root: Path) -> str:
    return f"""# Written by dankserve.testing: private image and container storage.
[storage]
driver = "overlay"
graphroot = "{graph_root}"
runroot = "{state_root}"
"""


def registries_conf(insecure: Sequence[str]) -> str:
    """Plain-HTTP registries the private service may pull from (the tests' registry on loopback)."""
    entries = "".join(f'\n[[registry]]\nlocation = "{loc}"\ninsecure = true\n' for loc in insecure)
    return f'unqualified-search-registries = ["docker.io"]\n{entries}'


@dataclass(frozen=True)
class PodmanEnv:
    """A running private Podman service and the environment the podman CLI needs to share it."""

    url: str
    socket: Path
    env: Mapping[str, str]
    service_log: Path
    session: str
    workdir: Path
    service_pid: int = 0

    def podman(self, *args: str, input: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run the podman CLI against the same storage and configuration as the service."""
        done = subprocess.run(
            ["podman", *args],
            input=input.decode() if input is not None else None,
            capture_output=True,
            text=True,
            env=dict(self.env),
            check=False,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def podman_bytes(self, *args: str, input: bytes) -> str:
        """Run the podman CLI feeding it binary input (an image tarball); its stdout."""
        done = subprocess.run(["podman", *args], input=input, capture_output=True, env=dict(self.env), check=False)
        if done.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)} failed ({done.returncode}): {done.stderr.decode().strip()}")
        return done.stdout.decode()

    def requests_logged(self, fragment: str, at_least: int = 0, timeout: float = 5.0) -> list[str]:
        """The service's access-log lines of requests whose path holds `fragment`.

        The service writes a line after it has answered, so a caller expecting `at_least`
        lines waits for them (and a moment more, so a surplus line shows too).
        """
        deadline = time.monotonic() + timeout
        while True:
            lines = self.service_log.read_text(errors="replace").splitlines()
            found = [line for line in lines if line.startswith("@ ") and fragment in line]
            if len(found) >= at_least or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if at_least:
            time.sleep(0.2)
            lines = self.service_log.read_text(errors="replace").splitlines()
            found = [line for line in lines if line.startswith("@ ") and fragment in line]
        return found


def _ping(socket_path: Path) -> bool:
    import http.client
    import socket

    class UnixConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(2)
            self.sock.connect(str(socket_path))

    conn = UnixConnection("localhost", timeout=2)
    try:
        conn.request("GET", "/_ping")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def private_env(workdir: Path, *, purpose: str = "tests", insecure_registries: Sequence[str] = ()) -> dict[str, str]:
    """Write the private configuration into workdir; the environment the podman CLI and service need."""
    workdir.mkdir(parents=True, exist_ok=True)
    graph = storage_root(purpose)
    state = run_root(graph, purpose)
    graph.mkdir(parents=True, exist_ok=True)
    state.mkdir(parents=True, exist_ok=True)
    conf = workdir / "containers.conf"
    conf.write_text(containers_conf(state / "libpod", workdir / "events.log"))
    storage = workdir / "storage.conf"
    storage.write_text(storage_conf(graph, state / "storage"))
    registries = workdir / "registries.conf"
    registries.write_text(registries_conf(insecure_registries))
    return {
        **os.environ,
        "CONTAINERS_CONF": str(conf),
        "CONTAINERS_STORAGE_CONF": str(storage),
        "CONTAINERS_REGISTRIES_CONF": str(registries),
    }


@contextmanager
def podman_service(
    workdir: Path, *, purpose: str = "tests", insecure_registries: Sequence[str] = ()
) -> Iterator[PodmanEnv]:
    """Write the private configuration, start the service on a socket in workdir, stop it after."""
    env = private_env(workdir, purpose=purpose, insecure_registries=insecure_registries)
    socket_path = workdir / "podman.sock"
    service_log = workdir / "service.log"
    with service_log.open("wb") as log_file:
        # --log-level=info makes the service write an access-log line per request (retry tests).
        process = subprocess.Popen(
            ["podman", "--log-level=info", "system", "service", "--time=0", f"unix://{socket_path}"],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while not (socket_path.exists() and _ping(socket_path)):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = service_log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"podman system service did not come up (exit {process.poll()}):\n{tail}")
            time.sleep(0.1)
        yield PodmanEnv(
            url=f"unix://{socket_path}",
            socket=socket_path,
            env=env,
            service_log=service_log,
            session=uuid.uuid4().hex[:8],
            workdir=workdir,
            service_pid=process.pid,
        )
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def leftover_containers(env: PodmanEnv, labels: Sequence[str]) -> list[str]:
    """Names of containers carrying any of the `key=value` (or `key`) labels."""
    names: set[str] = set()
    for label in labels:
        done = env.podman("ps", "-a", "--filter", f"label={label}", "--format", "{{.Names}}")
        names.update(line for line in done.stdout.split() if line)
    return sorted(names)


def remove_containers(env: PodmanEnv, names: Sequence[str]) -> None:
    if names:
        env.podman("rm", "-f", "-t", "0", *names, check=False)


def build_stand_in_image(env: PodmanEnv, *, quiet: bool = False) -> str:
    """The stand-in vLLM image (containers/, `make fake-vllm-image`) built into this storage; its ref.

    The build is skipped when the image is up to date; the first one makes a Debian rootfs with
    mmdebstrap from the host's apt sources (cached under build/fake-vllm/ of the source tree).
    """
    script = REPO / "containers" / "build-image.sh"
    if not script.is_file():
        raise RuntimeError(f"{script} is missing: the stand-in image is built from a dankserve source checkout")
    out = subprocess.DEVNULL if quiet else None
    subprocess.run(["bash", str(script)], env={**env.env, "PODMAN": "podman"}, stdout=out, check=True, cwd=REPO)
    return STAND_IN_REF
