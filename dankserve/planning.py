"""Planning with the world read in: the catalogue, the model's files in the HF cache, the
settings. The pure planner (`dankserve.plan`) gets everything as arguments; this module is its
thin imperative shell, shared by `dankserve plan` and the daemon so both plan alike.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from dankserve.backend_address import UNIX_PATH_MAX, BackendAddress, TcpAddress, UnixAddress, endpoint
from dankserve.errors import ConfigError
from dankserve.plan.releases import GatewayQueue
from dankserve.runtime.base import CONTAINER_BACKEND_RUN, CONTAINER_HF_HOME, CONTAINER_VLLM_CACHE_ROOT

if TYPE_CHECKING:
    from collections.abc import Sequence

    from dankserve.host.model import Host
    from dankserve.plan.cluster import GroupMember
    from dankserve.plan.models import ModelFacts
    from dankserve.plan.rules import OffloadShare
    from dankserve.plan.types import Plan
    from dankserve.settings import DeploymentSettings, Settings

__all__ = [
    "CONTAINER_HF_HOME",
    "CONTAINER_VLLM_CACHE_ROOT",
    "ad_hoc_name",
    "compile_cache_dir",
    "model_setting",
    "plan_one",
    "vllm_cache_root",
]


def ad_hoc_name(model: str) -> str:
    """The name of the deployment `dankserve plan --model M` (or `pull --model M`) plans without a config table:
    what the user wrote, so every message and plan names it so; no configured name can hold its space."""
    return f"--model {model}"


def model_setting(name: str, model: str) -> str:
    """A deployment's model as the user set it, for messages: the config key with its value, or `--model M`."""
    return f"--model {model!r}" if name == ad_hoc_name(model) else f"deployments.{name}.model = {model!r}"


def compile_cache_dir(settings: Settings, deployment: str) -> Path:
    """The host directory holding this deployment's torch.compile cache (VLLM_CACHE_ROOT)."""
    return settings.cache_dir / "deployments" / deployment / "vllm"


def vllm_cache_root(settings: Settings, deployment: str, dep: DeploymentSettings) -> str:
    """VLLM_CACHE_ROOT as vLLM sees it: the container path, or the host dir for a process."""
    if dep.runtime == "process":
        return str(compile_cache_dir(settings, deployment))
    return CONTAINER_VLLM_CACHE_ROOT


SERVER_SOCKET = "vllm.sock"
"""A deployment's server socket, in its backend directory."""
TRIAL_SOCKET = "trial.sock"
"""An upgrade's trial server's socket, beside the deployment's (the same directory: one container mount)."""


def backend_dir(settings: Settings, deployment: str) -> Path:
    """The deployment's private directory (0700, the daemon's user) holding its server's unix socket: named after
    the deployment, or after a hash of its name where that would make a socket's path too long for Linux."""
    root = settings.state_dir / "backends"
    longest = max(len(SERVER_SOCKET), len(TRIAL_SOCKET))
    if len(str(root / deployment).encode()) + 1 + longest <= UNIX_PATH_MAX:
        return root / deployment
    # A deployment name never holds a "." (settings refuse it): no name can take this directory's place.
    return root / f"h.{hashlib.sha256(deployment.encode()).hexdigest()[:12]}"


def backend_socket(
    settings: Settings, deployment: str, dep: DeploymentSettings, name: str = SERVER_SOCKET
) -> Path | None:
    """The host path of the deployment's server socket (None: it listens on TCP, `listen`)."""
    if not settings.serves_on_socket(dep):
        return None
    path = backend_dir(settings, deployment) / name
    if len(str(path).encode()) > UNIX_PATH_MAX:
        raise ConfigError(
            f"deployment {deployment!r} listens on a unix socket, and its path {str(path)!r} is "
            f"{len(str(path).encode())} bytes long: a unix socket's path holds at most {UNIX_PATH_MAX}",
            fix=f'set a shorter state_dir, or deployments.{deployment}.listen = "tcp"',
        )
    return path


def backend_address(
    settings: Settings, deployment: str, dep: DeploymentSettings, name: str = SERVER_SOCKET
) -> BackendAddress:
    """Where dankserve reaches the deployment's server: its private socket, or TCP host:port."""
    path = backend_socket(settings, deployment, dep, name)
    return TcpAddress(dep.host, dep.port) if path is None else UnixAddress(path)


def client_endpoint(settings: Settings, deployment: str, dep: DeploymentSettings) -> str:
    """Where clients send the deployment's requests (`status`, `up`): the gateway's URL when its server is on the
    private socket behind it (the socket answers dankserve alone), else the server's own address."""
    from dankserve.settings import split_listen

    address = backend_address(settings, deployment, dep)
    if isinstance(address, UnixAddress) and settings.gateway is not None:
        host, port = split_listen(settings.gateway.listen)
        return TcpAddress(host, port).url("/v1")
    return endpoint(address)


def vllm_socket(settings: Settings, deployment: str, dep: DeploymentSettings) -> str | None:
    """The socket path vLLM binds (`--uds`) as the server sees it: the host path for a process, the mounted
    directory's path in a container; None: TCP."""
    path = backend_socket(settings, deployment, dep)
    if path is None:
        return None
    return str(path) if dep.runtime == "process" else f"{CONTAINER_BACKEND_RUN}/{path.name}"


def wants_hub(dep: DeploymentSettings) -> bool:
    """Whether dankserve asks the Hub about this model: a Hub id, and no facts declared by hand."""
    from dankserve.hub.access import is_hub_id

    return is_hub_id(dep.model) and dep.model_facts is None


def check_local_model(settings: Settings, name: str, dep: DeploymentSettings) -> None:
    """A model written as a path must be a directory on this host (ConfigError, exit 2, naming it)."""
    from dankserve.errors import ConfigError
    from dankserve.hub.access import is_local_path
    from dankserve.hub.cache import host_model_path

    if not is_local_path(dep.model):
        return
    path = host_model_path(settings.hf_cache_dir, dep.model)
    if path.is_dir():
        return
    where = "" if path == Path(dep.model) else f" (on this host {path})"
    what = "is not a directory" if path.exists() else "does not exist"
    raise ConfigError(
        f"{model_setting(name, dep.model)}: the local path{where} {what}",
        fix="name the directory holding the model's config.json and weights, or a Hub model as ORG/NAME "
        "(a container reads paths under /root/.cache/huggingface from hf_cache_dir)",
    )


def model_facts_for(settings: Settings, name: str, dep: DeploymentSettings) -> ModelFacts:
    """The model's facts: the HF cache, else the Hub (kept under the state dir), with `model_facts` on top.

    An uncached Hub model that the Hub refuses (gated, unknown, no network) stops the plan
    (exit 2/3) unless model_facts are declared: then the Hub is not asked.
    """
    from dataclasses import replace

    from dankserve.errors import DankserveError
    from dankserve.hub.access import hub_access
    from dankserve.hub.cache import read_model_files
    from dankserve.hub.remote import cached_or_fetch
    from dankserve.plan.models import declared_facts, facts_from_files, facts_from_hub, merge_facts

    check_local_model(settings, name, dep)
    files = read_model_files(settings.hf_cache_dir, dep.model, dep.revision)
    found = facts_from_files(dep.model, files) if files is not None else None
    if wants_hub(dep) and (found is None or found.parameter_bytes is None):
        access = hub_access(settings.hf_cache_dir, settings.state_dir, name, dep.hf_token_file)
        try:
            remote = cached_or_fetch(access, dep.model, dep.revision)
        except DankserveError:
            if found is None:
                raise
        else:
            from_hub = facts_from_hub(dep.model, remote.config, remote.parameter_bytes, remote.commit)
            # a partly downloaded snapshot: the Hub knows the size of all of it
            found = from_hub if found is None else replace(found, parameter_bytes=from_hub.parameter_bytes)
    declared = declared_facts(dep.model, dep.model_facts) if dep.model_facts is not None else None
    return merge_facts(found, declared, dep.model)


def plan_one(
    settings: Settings,
    name: str,
    dep: DeploymentSettings,
    host: Host,
    *,
    vllm_version: str | None = None,
    learned_kv_cache_memory_bytes: int | None = None,
    max_model_len: int | str | None = None,
    gpu_memory_utilization: float | None = None,
    group: Sequence[GroupMember] | None = None,
) -> Plan:
    """The plan of one deployment; remediations (max_model_len, utilisation) override the config."""
    from dankserve.hub.adapters import adapter_facts
    from dankserve.plan.catalogue import capabilities, load_catalogue, version_from_image
    from dankserve.plan.plan import check_inputs, plan_deployment

    changes: dict[str, object] = {}
    if max_model_len is not None:
        changes["max_model_len"] = max_model_len
    if gpu_memory_utilization is not None:
        changes["gpu_memory_utilization"] = gpu_memory_utilization
    if changes:
        dep = dep.model_copy(update=changes)
    catalogue = load_catalogue()
    if dep.runtime == "process":  # no image to read a version from
        version = vllm_version or settings.vllm_version
    else:
        version = vllm_version or version_from_image(dep.image) or settings.vllm_version
    caps = capabilities(version, catalogue)
    if group is None:  # the user's own mistakes first (exit 2), before the Hub is asked
        check_inputs(name, dep, host, caps, catalogue)
    facts = model_facts_for(settings, name, dep)
    if group is not None:  # a multi-host deployment: every member's hardware (leader first)
        from dankserve.plan.cluster import plan_group

        return plan_group(
            name,
            dep,
            group,
            caps,
            facts,
            learned_kv_cache_memory_bytes=learned_kv_cache_memory_bytes,
            vllm_cache_root=vllm_cache_root(settings, name, dep),
            catalogue=catalogue,
            socket=vllm_socket(settings, name, dep),
        )
    return plan_deployment(
        name,
        dep,
        host,
        caps,
        facts,
        learned_kv_cache_memory_bytes=learned_kv_cache_memory_bytes,
        vllm_cache_root=vllm_cache_root(settings, name, dep),
        catalogue=catalogue,
        offload_share=host_offload_share(settings, name, dep, host),
        adapters=adapter_facts(settings.hf_cache_dir, name, dep) if dep.adapters else (),
        socket=vllm_socket(settings, name, dep),
        gateway=gateway_queue(settings),
    )


def gateway_queue(settings: Settings) -> GatewayQueue | None:
    """The gateway's cap and queue, which vLLM's own admission follows (None: no gateway)."""
    gateway = settings.gateway
    if gateway is None:
        return None
    return GatewayQueue(gateway.max_in_flight, gateway.queue_size)


def host_offload_share(settings: Settings, name: str, dep: DeploymentSettings, host: Host) -> OffloadShare:
    """The host RAM for CPU KV offload this deployment shares with every other enabled one on this host."""
    from dankserve.plan.rules import offload_share

    local = {n: d for n, d in settings.deployments.items() if d.enabled and not d.hosts}
    local[name] = dep
    return offload_share(host.memory.total_bytes, [d.kv_offload for d in local.values()])
