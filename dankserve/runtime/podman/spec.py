"""The container create request of a workload spec (pure): entrypoint, environment, mounts, secrets, ports."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dankserve.launcher import protocol
from dankserve.runtime.base import (
    CONTAINER_BACKEND_RUN,
    CONTAINER_HF_HOME,
    CONTAINER_LAUNCHER_DIR,
    CONTAINER_LAUNCHER_RUN,
    CONTAINER_VLLM_CACHE_ROOT,
    LABEL_CONTAINER_FINGERPRINT,
    LABEL_DEPLOYMENT,
    LABEL_LAUNCHER,
    LABEL_MANAGED,
    KernelsDir,
    LaunchRequest,
    SecretFile,
    WorkloadSpec,
    container_fingerprint,
    with_bind_address,
    with_socket,
    without_flags,
    workload_name,
)
from dankserve.runtime.podman import secret_mounts
from dankserve.runtime.podman.cdi import GpuPassthrough

JOURNAL_SOCKET = Path("/run/systemd/journal/socket")
HF_CACHE_TARGET = CONTAINER_HF_HOME
"""Where the HF cache is mounted (the supervisor passes it as a `Mount`)."""
SECRETS_DIR = "/run/secrets"


def secret_is_path(secret: SecretFile) -> bool:
    """True when vLLM learns of the secret through a variable naming its file (HF_TOKEN_PATH)."""
    return secret.env_var.endswith(("_PATH", "_FILE"))


def secret_name(deployment: str, secret: str) -> str:
    """The Podman secret of a deployment's secret (the `.` cannot occur in deployment names)."""
    return f"{workload_name(deployment)}.{secret}"


_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


_KERNELS_PATH = re.compile(r"/[A-Za-z0-9_./-]+")


def kernels_steps(kernels: KernelsDir) -> list[str]:
    """The shell steps of the kept kernels: download them where missing (a first boot), then put them first on
    PYTHONPATH. The download goes to a partial dir renamed when complete; it fails fast (no retries, a 10 s timeout)
    and a failure (an offline host) warns only."""
    if not _KERNELS_PATH.fullmatch(kernels.path) or ".." in kernels.path:
        raise ValueError(f"kernels dir {kernels.path!r} is not a plain absolute path")
    k = kernels.path
    warning = f"dankserve: vllm download-kernels into {k} failed: FlashInfer fetches or compiles kernels at start"
    pip = f"PIP_TARGET={k}.partial PIP_RETRIES=0 PIP_DEFAULT_TIMEOUT=10"
    steps = []
    if kernels.download:
        fetch = (
            f"rm -rf {k}.partial; {pip} vllm download-kernels && mv {k}.partial {k} || echo {shlex.quote(warning)} >&2"
        )
        steps.append(f"if [ ! -d {k} ]; then {fetch}; fi")
    steps.append(f'if [ -d {k} ]; then export PYTHONPATH="{k}${{PYTHONPATH:+:$PYTHONPATH}}"; fi')
    return steps


def serve_entrypoint(secrets: Sequence[SecretFile], kernels: KernelsDir | None = None) -> list[str]:
    """`vllm serve`, or a shell wrapper that reads value secrets from their files (and sets up the kept kernels)
    just before exec.

    The wrapper keeps a value out of `podman inspect` and argv; `set -e` makes an unreadable
    or missing file stop the container rather than start vLLM without its key.
    """
    values = [s for s in secrets if not secret_is_path(s)]
    if not values and kernels is None:
        return ["vllm", "serve"]
    parts = [*(kernels_steps(kernels) if kernels is not None else []), "set -e"]
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
    """The argv after `vllm serve`: on its socket (the mounted backend directory), or on the host's network
    binding the deployment's address itself, or the image's port that Podman publishes."""
    if spec.socket is not None:
        return with_socket(spec.argv, f"{CONTAINER_BACKEND_RUN}/{spec.socket.name}")
    if spec.host_network:
        return with_bind_address(spec.argv, spec.bind_host, spec.port)
    return tuple(without_flags(spec.argv, ("--uds",)))  # Podman publishes the image's port: no socket


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
    if spec.socket is not None:
        mounts.append(
            {"type": "bind", "source": str(spec.socket.parent), "target": CONTAINER_BACKEND_RUN, "read_only": False}
        )
    secrets = []
    for s in spec.secrets:
        if not _FILE_NAME.fullmatch(s.name):
            raise ValueError(f"secret name {s.name!r} is not a plain file name")
        if spec.secrets_dir is None:
            secrets.append({"source": secret_ids[s.name], "target": s.name})
    labels = {**spec.labels, LABEL_MANAGED: "true", LABEL_DEPLOYMENT: spec.deployment}
    if spec.secrets_dir is not None:  # files a restore with import finds again (secret_mounts.py)
        mounts += secret_mounts.mounts(spec.secrets_dir, spec.secrets)
        labels[secret_mounts.LABEL_SECRETS_DIR] = str(spec.secrets_dir)
    entrypoint, command = serve_entrypoint(spec.secrets, spec.kernels), list(server_argv(spec))
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
    elif spec.socket is None:  # on its socket the server has no port to publish
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
    if spec.criu_config is not None:  # Podman's checkpoint has no parameter for CRIU's own options
        kwargs["annotations"] = {"org.criu.config": str(spec.criu_config)}
    return kwargs
