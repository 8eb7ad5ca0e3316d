"""The narrow runtime interface: what the supervisor may ask of Podman or of a process runner.

Nothing above this module touches Podman or processes directly. A runtime executes a
`WorkloadSpec` it is handed; it knows nothing of planning, learning or restart policy.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Literal, Protocol

from dankserve.errors import EnvironmentUnusable

PullPolicy = Literal["missing", "always", "never"]

# Labels every dankserve workload carries; adoption and listing rely on them.
LABEL_MANAGED = "io.dankserve.managed"
LABEL_DEPLOYMENT = "io.dankserve.deployment"
LABEL_FINGERPRINT = "io.dankserve.fingerprint"
LABEL_BOOT = "io.dankserve.boot"
LABEL_LAUNCHER = "io.dankserve.launcher"
"""Set on a launcher workload (issue 15): its servers are started through its socket."""
LABEL_CONTAINER_FINGERPRINT = "io.dankserve.container-fingerprint"
"""A launcher's container-level settings (image, GPUs, mounts, ports ...): a boot with others replaces it."""


# Where things live inside a container workload: defined once here, read by the planner (the plan's
# VLLM_CACHE_ROOT), the supervisor (the HF-cache mount) and the runtimes (mounts, a process's env).
CONTAINER_VLLM_CACHE_ROOT = "/root/.cache/vllm"
"""The compile cache (VLLM_CACHE_ROOT) in a container; a process uses the host directory itself."""
CONTAINER_HF_HOME = "/root/.cache/huggingface"
"""The Hugging Face cache in a container (a Mount with this target); a process gets HF_HOME = its source."""
CONTAINER_LAUNCHER_DIR = "/opt/dankserve/launcher"
"""Where the launcher package is mounted (read-only) in a container."""
CONTAINER_LAUNCHER_RUN = "/run/dankserve-launcher"
"""Where the launcher's run directory (its socket) is mounted in a container."""
CONTAINER_BACKEND_RUN = "/run/dankserve-backend"
"""Where the deployment's backend directory (its server's unix socket, vLLM's --uds) is mounted in a container."""


def workload_name(deployment: str) -> str:
    """The container (or process) name of a deployment."""
    return f"dankserve-{deployment}"


@dataclass(frozen=True)
class GpuRef:
    """An assigned GPU: NVML index (PCI bus order) and UUID."""

    index: int
    uuid: str


@dataclass(frozen=True)
class Mount:
    """A host directory bound into the workload (ignored by the process runtime)."""

    source: Path
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class SecretFile:
    """A secret read from a host file and exposed to vLLM as a file, never as env or argv."""

    name: str
    """Secret name, e.g. `hf_token` or `api_key`."""
    source: Path
    """Host file holding the value."""
    env_var: str
    """How vLLM learns of it: `HF_TOKEN_PATH` points at the file; `VLLM_API_KEY` is read from it
    by the entrypoint wrapper just before exec."""


@dataclass(frozen=True)
class KernelsDir:
    """FlashInfer's precompiled kernels (`vllm download-kernels`, vLLM 0.32+) kept under the compile cache's mount.

    The entrypoint puts `path` first on PYTHONPATH when it exists; with `download`, a boot that finds it missing
    runs `vllm download-kernels` into it first (PIP_TARGET), and a failed download (an offline host) only warns."""

    path: str
    """Inside the container, under VLLM_CACHE_ROOT, one directory per vLLM release (kernels match its FlashInfer)."""
    download: bool


@dataclass(frozen=True)
class WorkloadSpec:
    """Everything needed to start one vLLM server for one deployment."""

    deployment: str
    image: str
    argv: tuple[str, ...]
    """Arguments after `vllm serve`."""
    env: Mapping[str, str]
    port: int
    bind_host: str = "127.0.0.1"
    container_port: int = 8000
    host_network: bool = False
    """Share the host's network and bind `bind_host:port` directly, publishing nothing (the supervisor
    decides it for loopback binds: a published port leaves the container's bridge address reachable
    by any neighbour that routes the Podman subnet through this host)."""
    pull: PullPolicy = "missing"
    gpus: tuple[GpuRef, ...] = ()
    mounts: tuple[Mount, ...] = ()
    secrets: tuple[SecretFile, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    shm_size: str | None = None
    """None: share the host's IPC namespace (ipc=host)."""
    numa_bind: bool = False
    """Adds SYS_NICE so vLLM can bind worker memory to NUMA nodes."""
    privileged: bool = False
    """Explicit opt-in only (SYS_ADMIN, apparmor=unconfined)."""
    executable: str | None = None
    """Process runtime: the `vllm` executable or a Python with vLLM."""
    cache_dir: Path | None = None
    """Host directory of this deployment's torch.compile cache (VLLM_CACHE_ROOT)."""
    launcher: LauncherSpec | None = None
    """Run the pre-imported vLLM launcher instead of `vllm serve`; servers are then asked of it."""
    socket: Path | None = None
    """Serve on this unix socket (host path; vLLM's --uds) instead of bind_host:port: its directory is the
    deployment's private one (0700), mounted into a container at CONTAINER_BACKEND_RUN."""
    kernels: KernelsDir | None = None
    """The kept kernels of the image's vLLM release (None: its release has no `vllm download-kernels`)."""
    criu_config: Path | None = None
    secrets_dir: Path | None = None
    """Podman: the secrets as files in this directory, bind-mounted, instead of Podman secrets (a snapshot
    deployment's container: its restore with import mounts what the archive names; podman/secret_mounts.py)."""
    """Podman: the CRIU configuration file runc hands CRIU at a checkpoint or restore of the container
    (the `org.criu.config` annotation; snapshots, issue 41). None: runc's default."""


@dataclass(frozen=True)
class LauncherSpec:
    """The launcher package on the host and its per-deployment run directory (its control socket)."""

    source: Path
    run_dir: Path


@dataclass(frozen=True)
class LaunchRequest:
    """What a launcher needs to start a server: the argv after `vllm serve`, the env, and variables whose
    values it reads from files just before the start (secrets stay out of the request)."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    env_files: Mapping[str, str] = field(default_factory=dict)


def container_fingerprint(spec: WorkloadSpec) -> str:
    """What a launcher workload is made of, beyond the server it runs: image (or executable), GPUs,
    mounts, ports, IPC, capabilities, secrets, the caches' location. Two specs with the same value can
    share a launcher; anything else in a spec (argv, env) reaches the launcher's next server."""
    parts = [
        spec.image,
        spec.executable or "",
        ",".join(f"{g.index}:{g.uuid}" for g in spec.gpus),
        ",".join(f"{m.source}:{m.target}:{m.read_only}" for m in spec.mounts),
        ",".join(f"{s.name}:{s.source}:{s.env_var}" for s in spec.secrets),
        f"{spec.bind_host}:{spec.port}:{spec.container_port}:{spec.host_network}",
        str(spec.socket.parent) if spec.socket is not None else "",
        f"{spec.shm_size}:{spec.numa_bind}:{spec.privileged}",
        str(spec.cache_dir or ""),
        str(spec.launcher.source if spec.launcher else ""),
    ]
    return "sha256:" + hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class ImageInfo:
    """A local image: the reference asked for, its digest, and the vLLM version it holds."""

    reference: str
    digest: str
    vllm_version: str | None
    entrypoint: tuple[str, ...] | None = None
    """The image's entrypoint as its config names it (`()`: none); None where not read (the process runtime:
    its command is the executable). What `launcher = "auto"` decides by (dankserve/launcher_choice.py)."""


@dataclass(frozen=True)
class PullProgress:
    """One progress report of an image pull."""

    reference: str
    status: str
    current_bytes: int | None = None
    total_bytes: int | None = None
    layer: str | None = None
    """The layer (short digest) the byte counts refer to; a pull reports each layer separately."""


WorkloadState = Literal["created", "running", "paused", "exited", "stopped", "unknown"]


@dataclass(frozen=True)
class Workload:
    """A running or finished workload, as the runtime sees it now."""

    id: str
    name: str
    deployment: str
    state: WorkloadState
    labels: Mapping[str, str]
    image: str = ""
    exit_code: int | None = None
    oom_killed: bool = False
    pid: int | None = None
    started_at: float | None = None
    """Unix time the workload started."""

    @property
    def fingerprint(self) -> str | None:
        return self.labels.get(LABEL_FINGERPRINT)

    @property
    def running(self) -> bool:
        return self.state == "running"


@dataclass(frozen=True)
class EndedServer:
    """A deployment's server the runtime has removed: its lines as kept (`runtime.log_archive`)."""

    workload_id: str
    lines: tuple[tuple[datetime | None, str], ...]
    """Each line with the time it was written (None where unknown), oldest first."""


@dataclass(frozen=True)
class ExitEvent:
    """A workload ended."""

    workload_id: str
    deployment: str
    exit_code: int | None
    oom_killed: bool = False


class Runtime(Protocol):
    """What the supervisor may ask of a runtime. Implementations (Podman, plain process, a multi-host
    group, the test fake) subclass it: the required methods have no body; the optional capabilities
    below have a default an implementation overrides when it has the capability (httpx's
    `BaseTransport` declares `close` with a default the same way), so no caller probes for them."""

    def ensure_image(
        self, image: str, pull: PullPolicy, progress: Callable[[PullProgress], None] | None = None
    ) -> ImageInfo:
        """Make the image present per the pull policy; its digest and vLLM version."""
        ...

    def start(self, spec: WorkloadSpec) -> Workload:
        """Create and start the workload; at most one per deployment: while one exists, starting is refused
        (replacing it is the supervisor's decision: it stops and removes the old one first)."""
        ...

    def stop(self, workload_id: str, timeout: float) -> None:
        """Stop gracefully, killing after `timeout` seconds; a workload already gone is fine."""
        ...

    def remove(self, workload_id: str) -> None:
        """Remove a stopped workload; one already gone is fine."""
        ...

    def logs(self, workload_id: str, follow: bool = False) -> Iterator[str]:
        """The workload's output as lines (without newlines), following if asked."""
        ...

    def wait(self, workload_id: str, timeout: float | None = None) -> ExitEvent | None:
        """Block until the workload exits (its event) or the timeout passes (None)."""
        ...

    def find(self, deployment: str) -> Workload | None:
        """The deployment's workload (running or not), or None."""
        ...

    def list_workloads(self) -> list[Workload]:
        """Every workload this runtime manages for dankserve, running or not."""
        ...

    def inspect(self, workload_id: str) -> Workload | None:
        """The workload now, or None when it no longer exists."""
        ...

    # -- optional capabilities, with their defaults -------------------------------------------

    def timed_logs(self, workload_id: str, follow: bool = False) -> Iterator[tuple[datetime | None, str]]:
        """The workload's lines, each with the time it was written (None where unknown), following if asked.

        Default: `logs` without times. Podman's k8s-file log keeps each line's time; the process runtime
        keeps them beside its log (`runtime.line_times`)."""
        for line in self.logs(workload_id, follow):
            yield None, line

    def ended_servers(self, deployment: str) -> list[EndedServer]:
        """The deployment's servers this runtime removed, oldest first, with their lines (bounded).

        Default: none kept. Podman and the process runtime keep the last few (`runtime.log_archive`)."""
        return []

    def launch_request(self, spec: WorkloadSpec) -> LaunchRequest:
        """What this runtime's launcher needs to start a server of `spec` (issue 15).

        Default: this runtime cannot run the launcher (a `launcher = true` deployment is refused)."""
        raise EnvironmentUnusable(
            f"deployment {spec.deployment!r}: this runtime cannot run the launcher", fix="set launcher = false"
        )

    def rename(self, workload_id: str, deployment: str) -> bool:
        """Give the workload `deployment`'s name (an upgrade's trial server handed over to the deployment), so
        that `find(deployment)` finds it. Default: this runtime cannot (False): the handover boots instead."""
        return False

    def adoptable(self) -> bool:
        """Whether a running workload found at start-up may be adopted. Default: yes (a multi-host group
        only while it watches its members)."""
        return True

    def watch_members(self, on_lost: Callable[[str], None]) -> None:
        """Report a lost member of a multi-host group to `on_lost(reason)`. Default: a single workload
        has no members, nothing to report."""
        return None


def with_bind_address(argv: tuple[str, ...], host: str, port: int) -> tuple[str, ...]:
    """The argv with --host/--port set to the deployment's address, replacing any other value (and any --uds):
    the address is the one `status` reports and the key protects (settings refuse them in extra_args)."""
    return (*without_flags(argv, ADDRESS_FLAGS), "--host", host, "--port", str(port))


def with_socket(argv: tuple[str, ...], path: str) -> tuple[str, ...]:
    """The argv serving on the unix socket `path` (vLLM's --uds), any --host/--port/--uds dropped."""
    return (*without_flags(argv, ADDRESS_FLAGS), "--uds", path)


ADDRESS_FLAGS = ("--host", "--port", "--uds")
"""vLLM's flags saying where the server listens (--uds wins over the other two)."""


def without_flags(argv: tuple[str, ...], flags: tuple[str, ...]) -> list[str]:
    """The argv without these flags and their values."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        elif not arg.startswith(tuple(f"{flag}=" for flag in flags)):
            out.append(arg)
    return out


def prepare_socket(path: Path) -> None:
    """Make the socket's directory private before a server binds `path`: created 0700 (and its parent), owned
    by this process's user, group and others' bits taken away; a socket left by an earlier server removed
    (vLLM binds without removing one: "Address already in use"). Refuses a directory another user owns or a
    link: whoever controls it could listen in the server's place."""
    for directory in (path.parent.parent, path.parent):
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = directory.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise EnvironmentUnusable(
                f"{directory} is not a directory owned by this user (uid {os.geteuid()}): the server's socket "
                "must be in a directory only dankserve can enter",
                fix=f"remove {directory}; dankserve creates it (mode 0700) at the next start",
            )
        if stat.S_IMODE(info.st_mode) & 0o077:
            os.chmod(directory, 0o700)
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()
