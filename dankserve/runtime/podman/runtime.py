"""`PodmanRuntime`: the Runtime over a Podman service, made of the session and its managers
(podman-py's client and its `containers`/`images` managers)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from dankserve.errors import DankserveError
from dankserve.runtime.base import (
    EndedServer,
    ExitEvent,
    ImageInfo,
    LaunchRequest,
    PullPolicy,
    PullProgress,
    Runtime,
    Workload,
    WorkloadSpec,
    prepare_socket,
    workload_name,
)
from dankserve.runtime.log_archive import LogArchive
from dankserve.runtime.podman import checkpoint as checkpointing
from dankserve.runtime.podman.cdi import DEFAULT_CDI_DIRS
from dankserve.runtime.podman.containers import ContainerManager
from dankserve.runtime.podman.images import ImageManager, image_entrypoint
from dankserve.runtime.podman.session import PodmanSession
from dankserve.runtime.podman.spec import JOURNAL_SOCKET, launch_request
from dankserve.runtime.podman.streams import LogStreams
from dankserve.runtime.podman.versions import VersionCache


class PodmanRuntime(Runtime):
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
        archive: LogArchive | None = None,
    ) -> None:
        """`archive`: where a removed container's lines are kept (None: nowhere, they go with it)."""
        self.url = url
        self._archive = archive
        self._journal_socket = journal_socket
        self._session = PodmanSession(url, request_timeout=request_timeout, attempts=attempts)
        self._containers = ContainerManager(self._session, cdi_dirs=cdi_dirs, dev_root=dev_root)
        self._streams = LogStreams(self._session)
        self._images = ImageManager(
            self._session,
            VersionCache(cache_dir / "vllm-versions.json" if cache_dir is not None else None),
            version_timeout=version_timeout,
            containers=self._containers,
            streams=self._streams,
        )

    def network_backend(self) -> str | None:
        """The service's network backend (`cni` or `netavark`), None when it does not say."""
        return self._session.network_backend()

    def remove_abandoned_probes(self) -> list[str]:
        """Removes the `vllm --version` probes a killed dankserve left (probes.py); their ids. Never fails."""
        return self._images.remove_abandoned_probes()

    def close(self) -> None:
        """Release the HTTP connections."""
        self._session.close()

    def image_present(self, image: str) -> bool:
        """The image is in local storage (no pull)."""
        return self._images.present(image)

    def local_entrypoint(self, image: str) -> tuple[str, ...] | None:
        """The entrypoint of the image in local storage (no pull); None when it is not there or unreadable."""
        attrs = self._images.attrs(image)
        return None if attrs is None else image_entrypoint(attrs)

    def ensure_image(
        self, image: str, pull: PullPolicy, progress: Callable[[PullProgress], None] | None = None
    ) -> ImageInfo:
        """Make the image present per the pull policy; its digest and vLLM version."""
        return self._images.ensure(image, pull, progress)

    def launch_request(self, spec: WorkloadSpec) -> LaunchRequest:
        """What this runtime's launcher needs to start a server of `spec` (issue 15)."""
        if spec.socket is not None:
            prepare_socket(spec.socket)
        return launch_request(spec)

    def start(self, spec: WorkloadSpec) -> Workload:
        """Create and start the deployment's container; one that exists is refused (the supervisor replaces)."""
        return self._containers.start(spec)

    def find(self, deployment: str) -> Workload | None:
        """The deployment's container, running or not, if dankserve manages one."""
        return self._containers.find(deployment)

    def stop(self, workload_id: str, timeout: float) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds (podman stop); a stopped or gone one is fine."""
        self._containers.stop(workload_id, timeout)

    def rename(self, workload_id: str, deployment: str) -> bool:
        """The container renamed to `deployment`'s (`podman rename`): an upgrade's trial handed over."""
        self._containers.rename(workload_id, deployment)
        return True

    def remove(self, workload_id: str) -> None:
        """Remove the container (forcibly) and its deployment's secrets; a gone one is fine. Its lines
        are kept in the archive first (Podman deletes its log with it)."""
        if self._archive is not None:
            with contextlib.suppress(DankserveError):  # Podman away: the removal below says so
                workload = self._containers.inspect(workload_id)
                if workload is not None:
                    # by its name: an upgrade's trial handed over (renamed) keeps the trial's labels
                    prefix = workload_name("")
                    named = workload.name
                    owner = named.removeprefix(prefix) if named.startswith(prefix) else workload.deployment
                    self._archive.keep(owner, workload.id, self._streams.timed_logs(workload.id))
        self._containers.remove(workload_id)

    def ended_servers(self, deployment: str) -> list[EndedServer]:
        """The deployment's removed containers' lines, oldest first (the archive's)."""
        return self._archive.ended(deployment) if self._archive is not None else []

    def logs(self, workload_id: str, follow: bool = False) -> Iterator[str]:
        """The container's stdout and stderr as lines; following until it exits if asked."""
        return self._streams.logs(workload_id, follow)

    def timed_logs(self, workload_id: str, follow: bool = False) -> Iterator[tuple[datetime | None, str]]:
        """The container's lines, each with the time conmon wrote it where its k8s-file log is read here."""
        return self._streams.timed_logs(workload_id, follow)

    def wait(self, workload_id: str, timeout: float | None = None) -> ExitEvent | None:
        """Block until the container exits (its ExitEvent) or the timeout passes (None)."""
        return self._containers.wait(workload_id, timeout)

    def events(self, since: float | None = None, until: float | None = None) -> Iterator[ExitEvent]:
        """Exits of dankserve's containers as they happen (from `since`, until `until` if given)."""
        return self._streams.events(since, until)

    def list_workloads(self) -> list[Workload]:
        """Every container dankserve manages, running or not."""
        return self._containers.list_workloads()

    def inspect(self, workload_id: str) -> Workload | None:
        """The container now, or None when it no longer exists."""
        return self._containers.inspect(workload_id)

    # -- snapshots (issue 41, checkpoint.py) -------------------------------------------------------
    def checkpoint(self, workload_id: str, export_to: Path, *, leave_running: bool = False) -> int:
        """The container checkpointed (it stops, unless `leave_running`: docs/snapshots.md says why a capture
        does not) and its archive written to `export_to`; its bytes."""
        return checkpointing.checkpoint(self._session, workload_id, export_to, leave_running=leave_running)

    def restore_in_place(self, workload_id: str) -> Workload:
        """The checkpointed container restored from its own images."""
        return self._restored(checkpointing.restore_in_place(self._session, workload_id))

    def restore_import(self, archive: Path, deployment: str) -> Workload:
        """The deployment's container restored from an exported archive (its name, ports and mounts)."""
        return self._restored(checkpointing.restore_import(self._session, archive, workload_name(deployment)))

    def _restored(self, container_id: str) -> Workload:
        workload = self._containers.inspect(container_id)
        if workload is None or not workload.running:
            raise checkpointing.PodmanCheckpointFailed(f"the restored container {container_id[:12]} is not running")
        return workload

    def container_attrs(self, workload_id: str) -> dict[str, Any] | None:
        """The libpod inspect document of a container (None: there is none)."""
        return self._session.container_attrs(workload_id)

    def info(self) -> dict[str, Any]:
        """`podman info` of the service."""
        info = self._session.call("read its info", self._session.client.info)
        return info if isinstance(info, dict) else {}
