"""Containers (podman-py's `containers` and `secrets` managers): a workload's container created and
started with its secrets, found, stopped, removed, waited for, listed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog

from dankserve.errors import ConfigError, DankserveError, PodmanRequestFailed
from dankserve.runtime.base import (
    LABEL_DEPLOYMENT,
    LABEL_MANAGED,
    ExitEvent,
    SecretFile,
    Workload,
    WorkloadSpec,
    prepare_socket,
    workload_name,
)
from dankserve.runtime.podman import secret_mounts
from dankserve.runtime.podman.cdi import choose_gpu_passthrough, present_device_nodes, read_cdi_device_names
from dankserve.runtime.podman.parsing import workload_from_inspect
from dankserve.runtime.podman.session import PodmanSession
from dankserve.runtime.podman.spec import container_create_kwargs, secret_name
from dankserve.secret_files import read_secret

log = structlog.get_logger("dankserve.runtime.podman")

_GONE = object()


class ContainerManager:
    """The workload containers of one Podman service."""

    def __init__(self, session: PodmanSession, *, cdi_dirs: Sequence[Path], dev_root: Path) -> None:
        self._session = session
        self._cdi_dirs = tuple(cdi_dirs)
        self._dev_root = dev_root

    def start(self, spec: WorkloadSpec) -> Workload:
        """Create and start the deployment's container; one that exists is refused (the supervisor replaces)."""
        session = self._session
        name = workload_name(spec.deployment)
        existing = session.container_attrs(name)
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
        if spec.socket is not None:
            prepare_socket(spec.socket)
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
        if spec.secrets_dir is not None:  # files at a path a restore with import finds (secret_mounts.py)
            secret_mounts.write(spec.secrets_dir, spec.secrets)
        secret_ids = self._replace_secrets(spec.deployment, () if spec.secrets_dir is not None else spec.secrets)
        # Podman's k8s-file log, not journald, even where journald runs: the daemon follows a
        # local k8s-file directly (READY in ms), while following journald-backed logs through
        # Podman 4.3's API delivered no lines here, which starves boot learning.
        kwargs = container_create_kwargs(spec, gpu=gpu, journald=False, secret_ids=secret_ids)
        container = None
        try:
            container = session.call(
                f"create container {name}", lambda: session.client.containers.create(spec.image, **kwargs)
            )
            session.call(f"start container {name}", container.start)
        except DankserveError:
            # A failed start leaves nothing behind: neither the container nor its secrets.
            if container is not None:
                session.remove_container(container.id)
            self._remove_secrets(spec.deployment)
            if spec.secrets_dir is not None:
                self._remove_secret_files({"Config": {"Labels": kwargs["labels"]}, "Mounts": _mounts_of(kwargs)})
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
                return str(self._session.client.secrets.create(podman_name, value).name or podman_name)

            ids[name] = self._session.call(f"create secret {podman_name}", create)
        return ids

    def _remove_secrets(self, deployment: str) -> None:
        prefix = secret_name(deployment, "")
        for secret in self._session.call("list secrets", self._session.client.secrets.list):
            if str(secret.name).startswith(prefix):
                self._session.delete(f"/secrets/{secret.id}", f"remove secret {secret.name}")

    def find(self, deployment: str) -> Workload | None:
        """The deployment's container, running or not, if dankserve manages one."""
        attrs = self._session.container_attrs(workload_name(deployment))
        if attrs is None:
            return None
        workload = workload_from_inspect(attrs)
        return workload if workload.labels.get(LABEL_MANAGED) == "true" else None

    def rename(self, workload_id: str, deployment: str) -> None:
        """`podman rename`: the container takes `deployment`'s name (its labels stay as created)."""
        session = self._session

        def run() -> None:
            response = session.client.api.post(
                f"/containers/{workload_id}/rename", params={"name": workload_name(deployment)}
            )
            response.raise_for_status()

        session.call(f"rename container {workload_id}", run)

    def stop(self, workload_id: str, timeout: float) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds (podman stop); a stopped or gone one is fine."""
        seconds = max(0, math.ceil(timeout))
        session = self._session

        def run() -> None:
            response = session.client.api.post(
                f"/containers/{workload_id}/stop",
                params={"timeout": seconds},
                timeout=seconds + session.request_timeout,
            )
            if response.status_code not in (304, 404):  # 304: already stopped
                response.raise_for_status()

        session.call(f"stop container {workload_id}", run)

    def remove(self, workload_id: str) -> None:
        """Remove the container (forcibly) and its deployment's secrets; a gone one is fine."""
        attrs = self._session.container_attrs(workload_id)
        if attrs is None:
            return
        self._session.remove_container(str(attrs["Id"]))
        self._remove_secret_files(attrs)
        deployment = ((attrs.get("Config") or {}).get("Labels") or {}).get(LABEL_DEPLOYMENT)
        if deployment:
            self._remove_secrets(deployment)

    def _remove_secret_files(self, attrs: dict[str, Any]) -> None:
        """A removed container's secret files (secret_mounts.py) deleted with the last container that mounts them:
        an upgrade's trial mounts the same files as the container it replaces, whose restore in place (a capture's)
        mounts them again."""
        named = ((attrs.get("Config") or {}).get("Labels") or {}).get(secret_mounts.LABEL_SECRETS_DIR)
        if named and not any(w.labels.get(secret_mounts.LABEL_SECRETS_DIR) == named for w in self.list_workloads()):
            secret_mounts.remove(attrs)

    def wait(self, workload_id: str, timeout: float | None = None) -> ExitEvent | None:
        """Block until the container exits (its ExitEvent) or the timeout passes (None).

        A container that no longer exists counts as exited with an unknown code.
        """
        from podman.errors import APIError, NotFound
        from requests.exceptions import Timeout

        session = self._session
        if timeout is None or timeout > 0:

            def run() -> object:
                try:
                    response = session.stream_client.api.post(
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

            if session.call(f"wait for {workload_id}", run) is None:
                return None
        attrs = session.container_attrs(workload_id)
        if attrs is None:
            return ExitEvent(workload_id=workload_id, deployment="", exit_code=None)
        workload = workload_from_inspect(attrs)
        if workload.state not in ("exited", "stopped"):
            return None
        return ExitEvent(workload.id, workload.deployment, workload.exit_code, workload.oom_killed)

    def list_workloads(self) -> list[Workload]:
        """Every container dankserve manages, running or not."""

        def ids() -> list[str]:
            containers = self._session.client.containers.list(all=True, filters={"label": f"{LABEL_MANAGED}=true"})
            return [str(c.id) for c in containers]

        workloads = []
        for container_id in self._session.call("list containers", ids):
            attrs = self._session.container_attrs(container_id)
            if attrs is not None:
                workloads.append(workload_from_inspect(attrs))
        return workloads

    def inspect(self, workload_id: str) -> Workload | None:
        """The container now, or None when it no longer exists."""
        attrs = self._session.container_attrs(workload_id)
        return workload_from_inspect(attrs) if attrs is not None else None


def _mounts_of(kwargs: dict[str, Any]) -> list[dict[str, str]]:
    """A create request's mounts as inspect names them (Source, Destination)."""
    return [{"Source": str(m["source"]), "Destination": str(m["target"])} for m in kwargs["mounts"]]
