"""The Podman runtime: vLLM in a container, driven through the Podman REST API (podman-py).

The decisions (which GPU passthrough, what the create request holds, how a pull report or an
event reads) are pure functions below; `PodmanRuntime` is the thin shell that sends them to the
service. podman-py, requests and tenacity are imported only when a runtime is built.
docs/podman-runtime.md explains what the container gets and why.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import structlog

from dankserve.errors import (
    ConfigError,
    DankserveError,
    GpuPassthroughUnavailable,
    ImageUnavailable,
    PodmanRequestFailed,
    PodmanUnreachable,
)
from dankserve.launcher import protocol
from dankserve.runtime.base import (
    CONTAINER_HF_HOME,
    CONTAINER_LAUNCHER_DIR,
    CONTAINER_LAUNCHER_RUN,
    CONTAINER_VLLM_CACHE_ROOT,
    LABEL_CONTAINER_FINGERPRINT,
    LABEL_DEPLOYMENT,
    LABEL_LAUNCHER,
    LABEL_MANAGED,
    ExitEvent,
    GpuRef,
    ImageInfo,
    LaunchRequest,
    PullPolicy,
    PullProgress,
    SecretFile,
    Workload,
    WorkloadSpec,
    WorkloadState,
    container_fingerprint,
    with_bind_address,
    workload_name,
)
from dankserve.runtime.logfile import ChangeWatch, follow_file, k8s_file_timed_lines, poll_briefly
from dankserve.secret_files import read_secret

if TYPE_CHECKING:
    from podman import PodmanClient

log = structlog.get_logger("dankserve.runtime.podman")

T = TypeVar("T")

CDI_KIND_NVIDIA_GPU = "nvidia.com/gpu"
DEFAULT_CDI_DIRS: tuple[Path, ...] = (Path("/etc/cdi"), Path("/var/run/cdi"))
JOURNAL_SOCKET = Path("/run/systemd/journal/socket")
HF_CACHE_TARGET = CONTAINER_HF_HOME
"""Where the HF cache is mounted (the supervisor passes it as a `Mount`)."""
SECRETS_DIR = "/run/secrets"
LABEL_VLLM_VERSION = "io.dankserve.vllm-version"
"""Image label naming the vLLM version the image holds; without it the image is run with --version."""
LABEL_PROBE = "io.dankserve.probe"
"""Marks the short-lived `vllm --version` containers (never LABEL_MANAGED: they are no workload)."""
# Control nodes CUDA opens besides /dev/nvidiaN; passed through when the host has them.
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
PODMAN_SOCKET_FIX = (
    "start the Podman API socket (`systemctl enable --now podman.socket`), "
    "or point podman_url / DANKSERVE_PODMAN_URL at where it listens"
)

# ---------------------------------------------------------------------------------------------
# Pure parts
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuPassthrough:
    """How the assigned GPUs reach the container, and the `devices` entries that do it."""

    mode: Literal["cdi", "device-nodes", "none"]
    devices: tuple[str, ...]


def cdi_device_names(text: str, *, is_json: bool) -> frozenset[str]:
    """The device names a CDI spec declares for kind nvidia.com/gpu (empty for other kinds).

    Raises ValueError (or a yaml error) for a file that is not a CDI spec document.
    """
    if is_json:
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError("not a CDI spec: the document is not a mapping")
    if data.get("kind") != CDI_KIND_NVIDIA_GPU:
        return frozenset()
    devices = data.get("devices") or []
    if not isinstance(devices, list):
        raise ValueError("not a CDI spec: `devices` is not a list")
    return frozenset(str(d["name"]) for d in devices if isinstance(d, dict) and d.get("name") is not None)


def choose_gpu_passthrough(
    gpus: Sequence[GpuRef], cdi_names: frozenset[str], dev_nodes: frozenset[str], dev_root: Path
) -> GpuPassthrough:
    """CDI when a spec lists every assigned GPU (by UUID, else index), else the device nodes.

    Device-node mode passes /dev/nvidia<index> per GPU plus the control nodes the host has;
    an assigned GPU with neither a CDI entry nor a node is an error.
    """
    if not gpus:
        return GpuPassthrough("none", ())
    cdi: list[str] = []
    for gpu in gpus:
        name = gpu.uuid if gpu.uuid in cdi_names else str(gpu.index) if str(gpu.index) in cdi_names else None
        if name is None:
            break
        cdi.append(f"{CDI_KIND_NVIDIA_GPU}={name}")
    else:
        return GpuPassthrough("cdi", tuple(cdi))
    missing = [gpu for gpu in gpus if f"nvidia{gpu.index}" not in dev_nodes]
    if missing:
        listed = ", ".join(f"{gpu.index} ({gpu.uuid})" for gpu in missing)
        raise GpuPassthroughUnavailable(
            f"GPU {listed} has no CDI entry ({CDI_KIND_NVIDIA_GPU}=UUID or =INDEX) and no device node "
            f"{dev_root}/nvidia{missing[0].index}",
            fix="generate a CDI spec with the NVIDIA Container Toolkit "
            "(`nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`), or load the NVIDIA driver",
        )
    names = [f"nvidia{gpu.index}" for gpu in gpus] + [n for n in CONTROL_NODES if n in dev_nodes]
    return GpuPassthrough("device-nodes", tuple(f"{dev_root / n}:/dev/{n}:rwm" for n in names))


def secret_is_path(secret: SecretFile) -> bool:
    """True when vLLM learns of the secret through a variable naming its file (HF_TOKEN_PATH)."""
    return secret.env_var.endswith(("_PATH", "_FILE"))


def secret_name(deployment: str, secret: str) -> str:
    """The Podman secret of a deployment's secret (the `.` cannot occur in deployment names)."""
    return f"{workload_name(deployment)}.{secret}"


_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def serve_entrypoint(secrets: Sequence[SecretFile]) -> list[str]:
    """`vllm serve`, or a shell wrapper that reads value secrets from their files just before exec.

    The wrapper keeps a value out of `podman inspect` and argv; `set -e` makes an unreadable
    or missing file stop the container rather than start vLLM without its key.
    """
    values = [s for s in secrets if not secret_is_path(s)]
    if not values:
        return ["vllm", "serve"]
    parts = ["set -e"]
    for s in values:
        if not _SHELL_NAME.fullmatch(s.env_var) or not _FILE_NAME.fullmatch(s.name):
            raise ValueError(f"secret {s.name!r} -> {s.env_var!r}: not a plain file or variable name")
        parts.append(f'{s.env_var}="$(cat {SECRETS_DIR}/{s.name})"')
        parts.append(f"export {s.env_var}")
    parts.append('exec vllm serve "$@"')
    return ["sh", "-c", "; ".join(parts), "sh"]


def container_env(spec: WorkloadSpec) -> dict[str, str]:
    """The container's environment: the plan's, the compile cache's location, secrets given as paths."""
    env = dict(spec.env)
    if spec.cache_dir is not None:
        env.setdefault("VLLM_CACHE_ROOT", CONTAINER_VLLM_CACHE_ROOT)
    for s in spec.secrets:
        if secret_is_path(s):
            env[s.env_var] = f"{SECRETS_DIR}/{s.name}"
    return env


def launch_request(spec: WorkloadSpec) -> LaunchRequest:
    """What the container's launcher needs for a server of `spec`: value secrets are read from their files
    by the launcher itself, as the `sh -c` wrapper does for a plain container."""
    files = {s.env_var: f"{SECRETS_DIR}/{s.name}" for s in spec.secrets if not secret_is_path(s)}
    return LaunchRequest(server_argv(spec), container_env(spec), files)


def server_argv(spec: WorkloadSpec) -> tuple[str, ...]:
    """The argv after `vllm serve`: on the host's network the server binds the deployment's address itself."""
    return with_bind_address(spec.argv, spec.bind_host, spec.port) if spec.host_network else tuple(spec.argv)


def container_create_kwargs(
    spec: WorkloadSpec, *, gpu: GpuPassthrough, journald: bool, secret_ids: Mapping[str, str]
) -> dict[str, Any]:
    """The keyword arguments of podman-py's `containers.create` for a workload spec.

    `secret_ids` maps each SecretFile name to the Podman secret created for it.
    """
    env = container_env(spec)
    mounts: list[dict[str, Any]] = [
        {"type": "bind", "source": str(m.source), "target": m.target, "read_only": m.read_only} for m in spec.mounts
    ]
    if spec.cache_dir is not None:
        mounts.append(
            {"type": "bind", "source": str(spec.cache_dir), "target": env["VLLM_CACHE_ROOT"], "read_only": False}
        )
    secrets = []
    for s in spec.secrets:
        if not _FILE_NAME.fullmatch(s.name):
            raise ValueError(f"secret name {s.name!r} is not a plain file name")
        secrets.append({"source": secret_ids[s.name], "target": s.name})
    labels = {**spec.labels, LABEL_MANAGED: "true", LABEL_DEPLOYMENT: spec.deployment}
    entrypoint, command = serve_entrypoint(spec.secrets), list(server_argv(spec))
    if spec.launcher is not None:
        # The image's own Python runs the launcher (stdlib only), mounted read-only; servers come from its socket.
        entrypoint = ["python3", f"{CONTAINER_LAUNCHER_DIR}/__main__.py", "--run-dir", CONTAINER_LAUNCHER_RUN]
        command = []
        mounts.append(
            {"type": "bind", "source": str(spec.launcher.source), "target": CONTAINER_LAUNCHER_DIR, "read_only": True}
        )
        mounts.append(
            {"type": "bind", "source": str(spec.launcher.run_dir), "target": CONTAINER_LAUNCHER_RUN, "read_only": False}
        )
        labels[LABEL_LAUNCHER] = "true"
        labels[LABEL_CONTAINER_FINGERPRINT] = container_fingerprint(spec)
        # Each server gets the spec's env anew; the rest (the image's, CDI's, Podman's) the launcher passes on.
        env[protocol.SPEC_ENV_VAR] = ",".join(sorted(env))
    kwargs: dict[str, Any] = {
        "name": workload_name(spec.deployment),
        "entrypoint": entrypoint,
        "command": command,
        "environment": env,
        "labels": labels,
        "mounts": mounts,
        "devices": list(gpu.devices),
        "secrets": secrets,
    }
    if spec.host_network:
        kwargs["network_mode"] = "host"
    else:
        kwargs["ports"] = {f"{spec.container_port}/tcp": (spec.bind_host, spec.port)}
    if spec.shm_size is None:
        kwargs["ipc_mode"] = "host"
    else:
        kwargs["shm_size"] = spec.shm_size
    caps = []
    if spec.numa_bind:
        caps.append("SYS_NICE")
    if spec.privileged:
        caps.append("SYS_ADMIN")
        kwargs["apparmor_profile"] = "unconfined"
    if caps:
        kwargs["cap_add"] = caps
    if journald:
        kwargs["log_config"] = {"Type": "journald"}
    return kwargs


def with_default_tag(image: str) -> str:
    """The reference with `:latest` added when it names neither a tag nor a digest."""
    last = image.rsplit("/", 1)[-1]
    return image if ":" in last or "@" in last else f"{image}:latest"


def pull_progress(reference: str, item: Mapping[str, Any]) -> PullProgress:
    """One report of Podman's (Docker-compatible) pull stream as a PullProgress."""
    detail = item.get("progressDetail") or {}
    current, total = detail.get("current"), detail.get("total")
    return PullProgress(
        reference=reference,
        status=str(item.get("status") or item.get("stream") or "").strip(),
        current_bytes=int(current) if isinstance(current, int) else None,
        total_bytes=int(total) if isinstance(total, int) and total > 0 else None,
        layer=str(item["id"]) if item.get("id") else None,
    )


def pull_error(item: Mapping[str, Any]) -> str | None:
    """The error a pull stream item reports (the HTTP status stays 200 on a failed pull)."""
    error = item.get("error") or (item.get("errorDetail") or {}).get("message")
    return str(error) if error else None


_VERSION_LINE = re.compile(r"^\s*v?(\d+\.\d+(?:\.\d+)?(?:[.+-][0-9A-Za-z.+-]+)?)\s*$")


def parse_vllm_version(output: str) -> str | None:
    """The version `vllm --version` printed: its last line that is a bare version number."""
    for line in reversed(output.splitlines()):
        match = _VERSION_LINE.match(line)
        if match:
            return match.group(1)
    return None


def split_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Log frames re-split into lines (a frame may hold several lines or part of one)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.decode("utf-8", "replace").rstrip("\r")
    if pending:
        yield pending.decode("utf-8", "replace").rstrip("\r")


_STATES: dict[str, WorkloadState] = {
    "configured": "created",
    "created": "created",
    "initialized": "created",
    "running": "running",
    "paused": "paused",
    "exited": "exited",
    "stopped": "stopped",
    "stopping": "stopped",
}


def parse_podman_time(value: str | None) -> float | None:
    """Unix time of a Go timestamp from `podman inspect`; None for Go's zero time."""
    if not value or value.startswith("0001-01-01"):
        return None
    # Go prints nanoseconds; Python takes at most microseconds.
    text = re.sub(r"(\.\d{6})\d+", r"\1", value.replace("Z", "+00:00"))
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def workload_from_inspect(attrs: Mapping[str, Any]) -> Workload:
    """A Workload from the libpod inspect document of a container."""
    state = attrs.get("State") or {}
    config = attrs.get("Config") or {}
    labels = dict(config.get("Labels") or {})
    status = str(state.get("Status") or "").lower()
    workload_state = _STATES.get(status, "unknown")
    exit_code = state.get("ExitCode")
    return Workload(
        id=str(attrs["Id"]),
        name=str(attrs.get("Name") or "").lstrip("/"),
        deployment=labels.get(LABEL_DEPLOYMENT, ""),
        state=workload_state,
        labels=labels,
        image=str(attrs.get("ImageName") or config.get("Image") or ""),
        exit_code=int(exit_code) if workload_state in ("exited", "stopped") and exit_code is not None else None,
        oom_killed=bool(state.get("OOMKilled")),
        pid=int(state["Pid"]) if state.get("Pid") else None,
        started_at=parse_podman_time(state.get("StartedAt")),
    )


def exit_event_from(event: Mapping[str, Any], oom_seen: bool = False) -> ExitEvent | None:
    """The ExitEvent of a `died` container event; None for any other event."""
    if (event.get("status") or event.get("Action")) != "died":
        return None
    actor = event.get("Actor") or {}
    attributes = actor.get("Attributes") or {}
    code = attributes.get("containerExitCode")
    return ExitEvent(
        workload_id=str(actor.get("ID") or event.get("id") or ""),
        deployment=str(attributes.get(LABEL_DEPLOYMENT, "")),
        exit_code=int(code) if code is not None and str(code).lstrip("-").isdigit() else None,
        oom_killed=oom_seen,
    )


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: the connection failed or Podman answered 5xx. Never 4xx, never a timeout."""
    from podman.errors import APIError
    from requests.exceptions import Timeout

    if isinstance(exc, APIError):
        if exc.status_code is None:
            return not isinstance(exc.__cause__, Timeout)
        return bool(exc.status_code >= 500)
    return isinstance(exc, OSError) and not isinstance(exc, Timeout)


# ---------------------------------------------------------------------------------------------
# Small I/O helpers
# ---------------------------------------------------------------------------------------------


def read_cdi_device_names(dirs: Iterable[Path]) -> frozenset[str]:
    """nvidia.com/gpu device names of every CDI spec file in dirs (unreadable files are skipped)."""
    names: set[str] = set()
    for directory in dirs:
        try:
            files = sorted(directory.iterdir())
        except OSError:
            continue
        for path in files:
            if path.suffix not in (".yaml", ".yml", ".json"):
                continue
            try:
                names |= cdi_device_names(path.read_text(), is_json=path.suffix == ".json")
            except Exception as exc:  # a broken spec of another vendor must not stop the workload
                log.warning("cdi_spec_unreadable", path=str(path), error=str(exc))
    return frozenset(names)


def present_device_nodes(dev_root: Path) -> frozenset[str]:
    """Names of the nvidia* device nodes under dev_root."""
    try:
        return frozenset(name for name in os.listdir(dev_root) if name.startswith("nvidia"))
    except OSError:
        return frozenset()


def conmon_exit_file(cmdline: Sequence[str], container_id: str) -> Path | None:
    """Where conmon writes the container's exit status (its `--exit-dir` and the container ID)."""
    for i, arg in enumerate(cmdline):
        if arg == "--exit-dir" and i + 1 < len(cmdline):
            return Path(cmdline[i + 1]) / container_id
        if arg.startswith("--exit-dir="):
            return Path(arg.partition("=")[2]) / container_id
    return None


def local_k8s_path(attrs: Mapping[str, Any]) -> Path | None:
    """The container's k8s-file log when it is readable on this host, else None."""
    log_config = (attrs.get("HostConfig") or {}).get("LogConfig") or {}
    path = Path(str(log_config.get("Path") or ""))
    if log_config.get("Type") != "k8s-file" or not log_config.get("Path") or not os.access(path, os.R_OK):
        return None
    return path


def local_k8s_log(attrs: Mapping[str, Any]) -> Iterator[tuple[datetime | None, str]] | None:
    """The lines (with conmon's time of each) of a running container's k8s-file log on this host,
    followed until it exits.

    None (read through the API instead) unless the log driver is k8s-file, the file is readable
    here, and the ConmonPid of the inspect document is visible here as conmon for this container.
    conmon drains the container's output into the file and syncs it before it writes the exit
    file, and exits after that, so once either happened the file holds the whole log. The
    follower sleeps on inotify and conmon's pidfd (ChangeWatch) where it can, else polls.
    """
    import psutil

    log_config = (attrs.get("HostConfig") or {}).get("LogConfig") or {}
    path = Path(str(log_config.get("Path") or ""))
    conmon_pid = (attrs.get("State") or {}).get("ConmonPid")
    container_id = str(attrs.get("Id") or "")
    if log_config.get("Type") != "k8s-file" or not conmon_pid or not container_id or not os.access(path, os.R_OK):
        return None
    try:
        conmon = psutil.Process(int(conmon_pid))
        exit_file = conmon_exit_file(conmon.cmdline(), container_id)
        watch = ChangeWatch.open(path, conmon.pid, exit_file.parent if exit_file else None)
        # After the pidfd is open: it is this container's conmon only if the pid still names it.
        if conmon.name() != "conmon" or container_id not in conmon.cmdline():
            if watch is not None:
                watch.close()
            return None
    except (psutil.Error, ValueError):
        return None

    def running() -> bool:
        if exit_file is not None and exit_file.exists():
            return False
        if watch is not None:
            return not watch.process_ended()
        try:
            return conmon.is_running() and conmon.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def lines() -> Iterator[tuple[datetime | None, str]]:
        try:
            yield from k8s_file_timed_lines(follow_file(path, True, running, watch.wait if watch else poll_briefly))
        finally:
            if watch is not None:
                watch.close()

    return lines()


class VersionCache:
    """vLLM version per image ID, kept in a small JSON file so each image is run at most once."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._versions: dict[str, str] = {}
        if path is not None:
            try:
                loaded = json.loads(path.read_text())
                if isinstance(loaded, dict):
                    self._versions = {str(k): str(v) for k, v in loaded.items()}
            except (OSError, ValueError):
                pass

    def get(self, image_id: str) -> str | None:
        return self._versions.get(image_id)

    def put(self, image_id: str, version: str) -> None:
        """Remember a version; kept in memory when the file cannot be written (read-only or full disk)."""
        self._versions[image_id] = version
        if self._path is None:
            return
        from dankserve.processes import write_private_file

        try:
            self._path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_private_file(self._path, json.dumps(self._versions, indent=1, sort_keys=True) + "\n")
        except OSError as exc:
            log.warning("version_cache_not_saved", path=str(self._path), error=exc.strerror or str(exc))


# ---------------------------------------------------------------------------------------------
# The runtime
# ---------------------------------------------------------------------------------------------

_GONE = object()


class PodmanRuntime:
    """The Runtime implementation over a Podman service (`podman system service`).

    Connects on construction: an unreachable service is PodmanUnreachable (exit 3). Transient
    failures (connection, 5xx) are retried a few times with a short backoff; 4xx are not.
    """

    def __init__(
        self,
        url: str,
        *,
        cache_dir: Path | None = None,
        cdi_dirs: Sequence[Path] = DEFAULT_CDI_DIRS,
        dev_root: Path = Path("/dev"),
        journal_socket: Path = JOURNAL_SOCKET,
        request_timeout: float = 60.0,
        attempts: int = 3,
        version_timeout: float = 120.0,
    ) -> None:
        from podman import PodmanClient

        self.url = url
        self._cdi_dirs = tuple(cdi_dirs)
        self._dev_root = dev_root
        self._journal_socket = journal_socket
        self._request_timeout = request_timeout
        self._attempts = attempts
        self._version_timeout = version_timeout
        self._versions = VersionCache(cache_dir / "vllm-versions.json" if cache_dir is not None else None)
        try:
            self._client: PodmanClient = PodmanClient(base_url=url, timeout=request_timeout)
            # Streams (pull, logs --follow, events, wait) may be silent for long: no read timeout.
            self._stream_client: PodmanClient = PodmanClient(base_url=url)
        except ValueError as exc:
            raise ConfigError(
                f"podman_url {url!r} is not a Podman API URL: {exc}",
                fix="use unix:///run/podman/podman.sock (or another unix://, tcp:// or ssh:// URL)",
            ) from exc
        if not self._call("reach the API", self._client.ping):
            raise PodmanUnreachable(f"{url} answers, but not as the Podman API", fix=PODMAN_SOCKET_FIX)

    def network_backend(self) -> str | None:
        """The service's network backend (`cni` or `netavark`), None when it does not say."""
        info = self._call("read its info", self._client.info)
        backend = (info.get("host") or {}).get("networkBackend") if isinstance(info, dict) else None
        return str(backend) if backend else None

    def close(self) -> None:
        """Release the HTTP connections."""
        self._client.close()  # type: ignore[no-untyped-call]
        self._stream_client.close()  # type: ignore[no-untyped-call]

    # -- plumbing ----------------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """fn() with retries of transient failures; Podman errors become DankserveErrors."""
        import tenacity
        from podman.errors import APIError

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(is_transient),
            stop=tenacity.stop_after_attempt(self._attempts),
            wait=tenacity.wait_exponential(multiplier=0.1, max=1.0),
            reraise=True,
        )
        try:
            return retrying(fn)
        except DankserveError:
            raise
        except APIError as exc:
            raise self._failure(what, exc) from exc
        except OSError as exc:
            raise self._failure(what, exc) from exc

    def _failure(self, what: str, exc: BaseException) -> DankserveError:
        from podman.errors import APIError
        from requests.exceptions import Timeout

        if isinstance(exc, APIError) and exc.status_code is not None:
            return PodmanRequestFailed(
                f"Podman at {self.url} refused to {what}: {exc.explanation or exc}",
                fix="read the reason above; `podman ps -a` and the Podman service's log tell more",
            )
        cause = exc.__cause__ if isinstance(exc, APIError) and exc.__cause__ is not None else exc
        if isinstance(cause, Timeout):
            return PodmanRequestFailed(
                f"Podman at {self.url} did not answer in time ({what})",
                fix="check the Podman service (`systemctl status podman.socket podman.service`)",
            )
        return PodmanUnreachable(f"the Podman API at {self.url} is unreachable ({what})", fix=PODMAN_SOCKET_FIX)

    def _container_attrs(self, ref: str) -> dict[str, Any] | None:
        from podman.errors import NotFound

        def get() -> dict[str, Any] | None:
            try:
                response = self._client.api.get(f"/containers/{ref}/json")
                response.raise_for_status()
            except NotFound:
                return None
            attrs: dict[str, Any] = response.json()
            return attrs

        return self._call(f"inspect container {ref}", get)

    def _image_attrs(self, image: str) -> dict[str, Any] | None:
        from podman.errors import ImageNotFound, NotFound

        def get() -> dict[str, Any] | None:
            try:
                attrs: dict[str, Any] = self._client.images.get(image).attrs
            except (ImageNotFound, NotFound):
                return None
            return attrs

        return self._call(f"inspect image {image}", get)

    # -- images ------------------------------------------------------------------------------

    def image_present(self, image: str) -> bool:
        """The image is in local storage (no pull)."""
        return self._image_attrs(image) is not None

    def ensure_image(
        self, image: str, pull: PullPolicy, progress: Callable[[PullProgress], None] | None = None
    ) -> ImageInfo:
        """Make the image present per the pull policy; its digest and vLLM version."""
        attrs = self._image_attrs(image)
        if attrs is None and pull == "never":
            raise ImageUnavailable(
                f"image {image} is not present and the pull policy is 'never'",
                fix=f'pull it (`podman pull {image}`) or set pull = "missing"',
            )
        if attrs is None or pull == "always":
            self._pull(image, progress)
            attrs = self._image_attrs(image)
            if attrs is None:
                raise ImageUnavailable(f"image {image} was pulled but Podman cannot find it", fix="pull it again")
        digest = str(attrs.get("Digest") or f"sha256:{attrs['Id']}")
        info = ImageInfo(reference=image, digest=digest, vllm_version=self._vllm_version(attrs))
        log.info("image_ready", image=image, digest=digest, vllm_version=info.vllm_version)
        return info

    def _pull(self, image: str, progress: Callable[[PullProgress], None] | None) -> None:
        # The Docker-compatible endpoint: it reports bytes per layer (Podman 4's libpod endpoint
        # only prints text) and honours registries.conf (libpod's tlsVerify overrides it).
        reference = with_default_tag(image)
        log.info("image_pull", image=reference)

        def run() -> None:
            response = self._stream_client.api.post(
                "/images/create", params={"fromImage": reference}, stream=True, compatible=True
            )
            response.raise_for_status()
            for line in response.iter_lines():
                if not line:
                    continue
                item = json.loads(line)
                error = pull_error(item)
                if error:
                    raise ImageUnavailable(
                        f"pulling {reference} failed: {error}",
                        fix="check the image name, that the registry is reachable, and credentials (`podman login`)",
                    )
                if progress is not None:
                    progress(pull_progress(reference, item))

        self._call(f"pull {reference}", run)

    def _vllm_version(self, attrs: Mapping[str, Any]) -> str | None:
        labels = attrs.get("Labels") or (attrs.get("Config") or {}).get("Labels") or {}
        if labels.get(LABEL_VLLM_VERSION):
            return str(labels[LABEL_VLLM_VERSION])
        image_id = str(attrs["Id"])
        cached = self._versions.get(image_id)
        if cached is not None:
            return cached
        version = self._run_version(image_id)
        if version is not None:
            self._versions.put(image_id, version)
        return version

    def _run_version(self, image_id: str) -> str | None:
        """`--entrypoint vllm IMAGE --version` in a short-lived container, removed afterwards."""
        container = self._call(
            "create the vLLM version probe",
            lambda: self._client.containers.create(
                image_id,
                entrypoint=["vllm"],
                command=["--version"],
                network_mode="none",
                labels={LABEL_PROBE: "vllm-version"},
            ),
        )
        try:
            self._call("start the vLLM version probe", container.start)
            event = self.wait(container.id, timeout=self._version_timeout)
            output = "\n".join(self.logs(container.id))
        finally:
            self._remove_container(container.id)
        version = parse_vllm_version(output) if event is not None and event.exit_code == 0 else None
        if version is None:
            log.warning("vllm_version_unknown", image=image_id, exit=event and event.exit_code, output=output[-500:])
        return version

    # -- workloads ---------------------------------------------------------------------------

    def launch_request(self, spec: WorkloadSpec) -> LaunchRequest:
        """What this runtime's launcher needs to start a server of `spec` (issue 15)."""
        return launch_request(spec)

    def start(self, spec: WorkloadSpec) -> Workload:
        """Create and start the deployment's container; one that exists is refused (the supervisor replaces)."""
        name = workload_name(spec.deployment)
        existing = self._container_attrs(name)
        if existing is not None:
            labels = (existing.get("Config") or {}).get("Labels") or {}
            if labels.get(LABEL_MANAGED) != "true":
                raise PodmanRequestFailed(
                    f"a container named {name} exists that dankserve does not manage",
                    fix=f"rename or remove it (`podman rm -f {name}`), or rename the deployment",
                )
            # Replacing is the supervisor's decision (it stops and removes the old one first).
            raise PodmanRequestFailed(
                f"container {name} ({existing['Id'][:12]}) already exists",
                fix=f"stop the deployment first (`dankserve down {spec.deployment}`) or `podman rm -f {name}`",
            )
        if spec.cache_dir is not None:
            spec.cache_dir.mkdir(parents=True, exist_ok=True)
        for mount in spec.mounts:
            if not mount.source.exists():
                raise ConfigError(
                    f"mount source {mount.source} (for {mount.target}) does not exist",
                    fix=f"create {mount.source} or correct the setting naming it",
                )
        gpu = choose_gpu_passthrough(
            spec.gpus, read_cdi_device_names(self._cdi_dirs), present_device_nodes(self._dev_root), self._dev_root
        )
        if spec.privileged:
            log.warning(
                "workload_privileged",
                deployment=spec.deployment,
                detail="SYS_ADMIN and apparmor=unconfined were asked for; CDI needs neither",
            )
        secret_ids = self._replace_secrets(spec.deployment, spec.secrets)
        # Podman's k8s-file log, not journald, even where journald runs: the daemon follows a
        # local k8s-file directly (READY in ms), while following journald-backed logs through
        # Podman 4.3's API delivered no lines here, which starves boot learning.
        kwargs = container_create_kwargs(spec, gpu=gpu, journald=False, secret_ids=secret_ids)
        container = None
        try:
            container = self._call(
                f"create container {name}", lambda: self._client.containers.create(spec.image, **kwargs)
            )
            self._call(f"start container {name}", container.start)
        except DankserveError:
            # A failed start leaves nothing behind: neither the container nor its secrets.
            if container is not None:
                self._remove_container(container.id)
            self._remove_secrets(spec.deployment)
            raise
        log.info("workload_started", deployment=spec.deployment, id=container.id[:12], gpus=gpu.mode)
        workload = self.inspect(container.id)
        if workload is None:
            raise PodmanRequestFailed(f"container {name} vanished right after it started", fix="see `podman events`")
        return workload

    def _replace_secrets(self, deployment: str, secrets: Sequence[SecretFile]) -> dict[str, str]:
        """Fresh Podman secrets from the files (so a changed file is picked up); name -> secret."""
        values = {s.name: read_secret(s.source, s.name) for s in secrets}  # read all first: fail before touching Podman
        self._remove_secrets(deployment)
        ids = {}
        for name, value in values.items():
            podman_name = secret_name(deployment, name)

            def create(podman_name: str = podman_name, value: bytes = value) -> str:
                return str(self._client.secrets.create(podman_name, value).name or podman_name)

            ids[name] = self._call(f"create secret {podman_name}", create)
        return ids

    def _remove_secrets(self, deployment: str) -> None:
        prefix = secret_name(deployment, "")
        for secret in self._call("list secrets", self._client.secrets.list):
            if str(secret.name).startswith(prefix):
                self._delete(f"/secrets/{secret.id}", f"remove secret {secret.name}")

    def _delete(self, path: str, what: str, params: Mapping[str, Any] | None = None) -> None:
        """DELETE a resource; one already gone is fine."""

        def run() -> None:
            response = self._client.api.delete(path, params=params)
            if response.status_code != 404:
                response.raise_for_status()

        self._call(what, run)

    def _remove_container(self, container_id: str) -> None:
        self._delete(f"/containers/{container_id}", f"remove container {container_id}", {"force": True, "v": True})

    def find(self, deployment: str) -> Workload | None:
        """The deployment's container, running or not, if dankserve manages one."""
        attrs = self._container_attrs(workload_name(deployment))
        if attrs is None:
            return None
        workload = workload_from_inspect(attrs)
        return workload if workload.labels.get(LABEL_MANAGED) == "true" else None

    def stop(self, workload_id: str, timeout: float) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds (podman stop); a stopped or gone one is fine."""
        seconds = max(0, math.ceil(timeout))

        def run() -> None:
            response = self._client.api.post(
                f"/containers/{workload_id}/stop",
                params={"timeout": seconds},
                timeout=seconds + self._request_timeout,
            )
            if response.status_code not in (304, 404):  # 304: already stopped
                response.raise_for_status()

        self._call(f"stop container {workload_id}", run)

    def remove(self, workload_id: str) -> None:
        """Remove the container (forcibly) and its deployment's secrets; a gone one is fine."""
        attrs = self._container_attrs(workload_id)
        if attrs is None:
            return
        self._remove_container(str(attrs["Id"]))
        deployment = ((attrs.get("Config") or {}).get("Labels") or {}).get(LABEL_DEPLOYMENT)
        if deployment:
            self._remove_secrets(deployment)

    def logs(self, workload_id: str, follow: bool = False) -> Iterator[str]:
        """The container's stdout and stderr as lines; following until it exits if asked."""
        for _, line in self.timed_logs(workload_id, follow):
            yield line

    def timed_logs(self, workload_id: str, follow: bool = False) -> Iterator[tuple[datetime | None, str]]:
        """The container's lines, each with the time conmon wrote it where its k8s-file log is read
        here (None through the API); following until it exits if asked.

        Following a running container of this host whose log is a k8s-file reads that file
        directly (local_k8s_log): Podman 4's follow stream polls it only every 250 ms, which
        would hold back every line, readiness included, by up to that.
        """
        if self.url.startswith("unix://"):
            attrs = self._container_attrs(workload_id)
            if attrs is not None and follow:
                local = local_k8s_log(attrs)
                if local is not None:
                    yield from local
                    return
            elif attrs is not None:
                # The same file as the follower reads, so both views cut lines alike.
                path = local_k8s_path(attrs)
                if path is not None:
                    yield from k8s_file_timed_lines(follow_file(path, False, lambda: False))
                    return
        for line in self._api_logs(workload_id, follow):
            yield None, line

    def _api_logs(self, workload_id: str, follow: bool) -> Iterator[str]:
        from podman.api import stream_frames
        from podman.errors import NotFound

        client = self._stream_client if follow else self._client

        def open_stream() -> Any:
            try:
                response = client.api.get(
                    f"/containers/{workload_id}/logs",
                    params={"follow": follow, "stdout": True, "stderr": True},
                    stream=True,
                )
                response.raise_for_status()
            except NotFound:
                return None
            return response

        response = self._call(f"read the logs of {workload_id}", open_stream)
        if response is None:
            return
        try:
            yield from split_lines(cast(Iterator[bytes], stream_frames(response)))
        except OSError as exc:
            raise self._failure(f"read the logs of {workload_id}", exc) from exc
        finally:
            response.close()

    def wait(self, workload_id: str, timeout: float | None = None) -> ExitEvent | None:
        """Block until the container exits (its ExitEvent) or the timeout passes (None).

        A container that no longer exists counts as exited with an unknown code.
        """
        from podman.errors import APIError, NotFound
        from requests.exceptions import Timeout

        if timeout is None or timeout > 0:

            def run() -> object:
                try:
                    response = self._stream_client.api.post(
                        f"/containers/{workload_id}/wait",
                        params={"condition": ["stopped", "exited"]},
                        timeout=timeout,
                    )
                    response.raise_for_status()
                except NotFound:
                    return _GONE
                except APIError as exc:
                    if isinstance(exc.__cause__, Timeout):
                        return None
                    raise
                return response.json()

            if self._call(f"wait for {workload_id}", run) is None:
                return None
        attrs = self._container_attrs(workload_id)
        if attrs is None:
            return ExitEvent(workload_id=workload_id, deployment="", exit_code=None)
        workload = workload_from_inspect(attrs)
        if workload.state not in ("exited", "stopped"):
            return None
        return ExitEvent(workload.id, workload.deployment, workload.exit_code, workload.oom_killed)

    def events(self, since: float | None = None, until: float | None = None) -> Iterator[ExitEvent]:
        """Exits of dankserve's containers as they happen (from `since`, until `until` if given)."""
        filters = [f"label={LABEL_MANAGED}=true", "type=container", "event=died", "event=oom"]
        stream = self._stream_client.events(  # type: ignore[no-untyped-call]
            filters=filters,
            decode=True,
            since=int(since) if since is not None else None,
            until=math.ceil(until) if until is not None else None,
        )
        oom: set[str] = set()
        try:
            for event in stream:
                actor_id = str((event.get("Actor") or {}).get("ID") or event.get("id") or "")
                if (event.get("status") or event.get("Action")) == "oom":
                    oom.add(actor_id)
                    continue
                exit_event = exit_event_from(event, oom_seen=actor_id in oom)
                if exit_event is None:
                    continue
                oom.discard(actor_id)
                if not exit_event.oom_killed:
                    attrs = self._container_attrs(exit_event.workload_id)
                    if attrs is not None and (attrs.get("State") or {}).get("OOMKilled"):
                        exit_event = ExitEvent(
                            exit_event.workload_id, exit_event.deployment, exit_event.exit_code, True
                        )
                yield exit_event
        except DankserveError:
            raise
        except Exception as exc:
            from podman.errors import APIError

            if isinstance(exc, APIError | OSError):
                raise self._failure("follow events", exc) from exc
            raise

    def list_workloads(self) -> list[Workload]:
        """Every container dankserve manages, running or not."""

        def ids() -> list[str]:
            containers = self._client.containers.list(all=True, filters={"label": f"{LABEL_MANAGED}=true"})
            return [str(c.id) for c in containers]

        workloads = []
        for container_id in self._call("list containers", ids):
            attrs = self._container_attrs(container_id)
            if attrs is not None:
                workloads.append(workload_from_inspect(attrs))
        return workloads

    def inspect(self, workload_id: str) -> Workload | None:
        """The container now, or None when it no longer exists."""
        attrs = self._container_attrs(workload_id)
        return workload_from_inspect(attrs) if attrs is not None else None
