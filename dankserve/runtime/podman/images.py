"""Images (podman-py's `images` manager, here with the pull policy): present or pulled, the digest,
and the vLLM version an image holds (its label, else `vllm --version` run once per image)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog

from dankserve.errors import DankserveError, ImageUnavailable
from dankserve.processes import is_same_process, start_time_of
from dankserve.runtime.base import ImageInfo, PullPolicy, PullProgress
from dankserve.runtime.podman.containers import ContainerManager
from dankserve.runtime.podman.parsing import (
    LABEL_PROBE,
    LABEL_VLLM_VERSION,
    parse_vllm_version,
    pull_error,
    pull_progress,
    with_default_tag,
)
from dankserve.runtime.podman.probes import LABEL_PROBE_OWNER, ProbeOwner, abandoned_probes
from dankserve.runtime.podman.session import PodmanSession
from dankserve.runtime.podman.streams import LogStreams
from dankserve.runtime.podman.versions import VersionCache

log = structlog.get_logger("dankserve.runtime.podman")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class ImageManager:
    """The images of one Podman service."""

    def __init__(
        self,
        session: PodmanSession,
        versions: VersionCache,
        *,
        version_timeout: float,
        containers: ContainerManager,
        streams: LogStreams,
    ) -> None:
        self._session = session
        self._versions = versions
        self._version_timeout = version_timeout
        self._containers = containers
        self._streams = streams

    def attrs(self, image: str) -> dict[str, Any] | None:
        """The image's inspect document, or None when it is not in local storage."""
        from podman.errors import ImageNotFound, NotFound

        def get() -> dict[str, Any] | None:
            try:
                attrs: dict[str, Any] = self._session.client.images.get(image).attrs
            except (ImageNotFound, NotFound):
                return None
            return attrs

        return self._session.call(f"inspect image {image}", get)

    def present(self, image: str) -> bool:
        """The image is in local storage (no pull)."""
        return self.attrs(image) is not None

    def ensure(self, image: str, pull: PullPolicy, progress: Callable[[PullProgress], None] | None = None) -> ImageInfo:
        """Make the image present per the pull policy; its digest and vLLM version."""
        attrs = self.attrs(image)
        if attrs is None and pull == "never":
            raise ImageUnavailable(
                f"image {image} is not present and the pull policy is 'never'",
                fix=f'pull it (`podman pull {image}`) or set pull = "missing"',
            )
        if attrs is None or pull == "always":
            self._pull(image, progress)
            attrs = self.attrs(image)
            if attrs is None:
                raise ImageUnavailable(f"image {image} was pulled but Podman cannot find it", fix="pull it again")
        digest = str(attrs.get("Digest") or f"sha256:{attrs['Id']}")
        info = ImageInfo(
            reference=image, digest=digest, vllm_version=self._vllm_version(attrs), entrypoint=image_entrypoint(attrs)
        )
        log.info("image_ready", image=image, digest=digest, vllm_version=info.vllm_version, entrypoint=info.entrypoint)
        return info

    def _pull(self, image: str, progress: Callable[[PullProgress], None] | None) -> None:
        # The Docker-compatible endpoint: it reports bytes per layer (Podman 4's libpod endpoint
        # only prints text) and honours registries.conf (libpod's tlsVerify overrides it).
        reference = with_default_tag(image)
        log.info("image_pull", image=reference)

        def run() -> None:
            response = self._session.stream_client.api.post(
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

        self._session.call(f"pull {reference}", run)

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
        session = self._session
        self.remove_abandoned_probes()
        owner = ProbeOwner(_boot_id() or "-", os.getpid(), start_time_of(os.getpid()))
        container = session.call(
            "create the vLLM version probe",
            lambda: session.client.containers.create(
                image_id,
                entrypoint=["vllm"],
                command=["--version"],
                network_mode="none",
                labels={LABEL_PROBE: "vllm-version", LABEL_PROBE_OWNER: owner.label()},
            ),
        )
        try:
            session.call("start the vLLM version probe", container.start)
            event = self._containers.wait(container.id, timeout=self._version_timeout)
            output = "\n".join(self._streams.logs(container.id))
        finally:
            session.remove_container(container.id)
        version = parse_vllm_version(output) if event is not None and event.exit_code == 0 else None
        if version is None:
            log.warning("vllm_version_unknown", image=image_id, exit=event and event.exit_code, output=output[-500:])
        return version

    def remove_abandoned_probes(self) -> list[str]:
        """Removes the version probes whose owner was killed before it could (probes.py); their ids. Never
        fails: a probe left now is removed by the next call."""

        def listed() -> list[dict[str, Any]]:
            found = self._session.client.containers.list(all=True, filters={"label": LABEL_PROBE})
            return [dict(c.attrs) for c in found]

        try:
            gone = abandoned_probes(
                self._session.call("list the vLLM version probes", listed),
                now=time.time(),
                timeout=self._version_timeout,
                this_boot=_boot_id(),
                alive=is_same_process,
            )
        except DankserveError as exc:
            log.warning("version_probes_unlisted", error=str(exc))
            return []
        removed = []
        for container_id in gone:
            with contextlib.suppress(DankserveError):
                self._session.remove_container(container_id)
                removed.append(container_id)
                log.info("version_probe_removed", container_id=container_id[:12], why="its owner is gone")
        return removed


@functools.cache
def _boot_id() -> str | None:
    """This boot's id (None where /proc does not say): a pid means the same process only within one boot. Read
    once: it cannot change while this process runs."""
    try:
        text = BOOT_ID.read_text().strip()
    except OSError:
        return None
    return text if text and len(text) <= 64 and " " not in text else None


_MAX_ENTRYPOINT_WORDS = 64
_MAX_WORD = 4096


def image_entrypoint(attrs: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The entrypoint of an image's inspect document (`Config.Entrypoint`; `()` where it has none), or None
    where it is not a list of words within bounds. The image's `Cmd` is not part of what the launcher replaces:
    dankserve passes the plan's arguments in its place."""
    config = attrs.get("Config")
    if not isinstance(config, Mapping):
        return None
    words = config.get("Entrypoint")
    if words is None:
        return ()
    if isinstance(words, str):  # Docker's shell form: run by /bin/sh -c
        words = ["/bin/sh", "-c", words]
    if not isinstance(words, list) or len(words) > _MAX_ENTRYPOINT_WORDS:
        return None
    if not all(isinstance(w, str) and len(w) <= _MAX_WORD for w in words):
        return None
    return tuple(words)
