"""The connection to the Podman service: two podman-py clients, retries of transient failures, and
Podman's errors turned into dankserve's (the managers below all send through it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from dankserve.errors import ConfigError, DankserveError, PodmanRequestFailed, PodmanUnreachable
from dankserve.runtime.podman.parsing import is_transient

if TYPE_CHECKING:
    from podman import PodmanClient

T = TypeVar("T")

PODMAN_SOCKET_FIX = (
    "start the Podman API socket (`systemctl enable --now podman.socket`), "
    "or point podman_url / DANKSERVE_PODMAN_URL at where it listens"
)


class PodmanSession:
    """One Podman service: `client` (requests time out after `request_timeout`) and `stream_client`
    (pull, logs --follow, events and wait may be silent for long: no read timeout).

    Connects on construction: an unreachable service is PodmanUnreachable (exit 3)."""

    def __init__(self, url: str, *, request_timeout: float, attempts: int) -> None:
        from podman import PodmanClient

        self.url = url
        self.request_timeout = request_timeout
        self._attempts = attempts
        try:
            self.client: PodmanClient = PodmanClient(base_url=url, timeout=request_timeout)
            self.stream_client: PodmanClient = PodmanClient(base_url=url)
        except ValueError as exc:
            raise ConfigError(
                f"podman_url {url!r} is not a Podman API URL: {exc}",
                fix="use unix:///run/podman/podman.sock (or another unix://, tcp:// or ssh:// URL)",
            ) from exc
        if not self.call("reach the API", self.client.ping):
            raise PodmanUnreachable(f"{url} answers, but not as the Podman API", fix=PODMAN_SOCKET_FIX)

    def close(self) -> None:
        """Release the HTTP connections."""
        self.client.close()  # type: ignore[no-untyped-call]
        self.stream_client.close()  # type: ignore[no-untyped-call]

    def call(self, what: str, fn: Callable[[], T]) -> T:
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
            raise self.failure(what, exc) from exc
        except OSError as exc:
            raise self.failure(what, exc) from exc

    def failure(self, what: str, exc: BaseException) -> DankserveError:
        """The DankserveError of a request that failed (after its retries)."""
        from podman.errors import APIError
        from requests.exceptions import Timeout

        if isinstance(exc, APIError) and exc.status_code is not None:
            return PodmanRequestFailed(
                f"Podman at {self.url} refused to {what}: {exc.explanation or exc}",
                fix="read the reason above; `podman ps -a` and the Podman service's log tell more",
                transient=exc.status_code >= 500,  # its own failure, still there after the retries: tried later
            )
        cause = exc.__cause__ if isinstance(exc, APIError) and exc.__cause__ is not None else exc
        if isinstance(cause, Timeout):
            return PodmanRequestFailed(
                f"Podman at {self.url} did not answer in time ({what})",
                fix="check the Podman service (`systemctl status podman.socket podman.service`)",
                transient=True,  # busy, paused or restarting: the request is tried again later
            )
        return PodmanUnreachable(f"the Podman API at {self.url} is unreachable ({what})", fix=PODMAN_SOCKET_FIX)

    def delete(self, path: str, what: str, params: Mapping[str, Any] | None = None) -> None:
        """DELETE a resource; one already gone is fine."""

        def run() -> None:
            response = self.client.api.delete(path, params=params)
            if response.status_code != 404:
                response.raise_for_status()

        self.call(what, run)

    def container_attrs(self, ref: str) -> dict[str, Any] | None:
        """The libpod inspect document of a container, or None when there is none."""
        from podman.errors import NotFound

        def get() -> dict[str, Any] | None:
            try:
                response = self.client.api.get(f"/containers/{ref}/json")
                response.raise_for_status()
            except NotFound:
                return None
            attrs: dict[str, Any] = response.json()
            return attrs

        return self.call(f"inspect container {ref}", get)

    def remove_container(self, container_id: str) -> None:
        self.delete(f"/containers/{container_id}", f"remove container {container_id}", {"force": True, "v": True})

    def network_backend(self) -> str | None:
        """The service's network backend (`cni` or `netavark`), None when it does not say."""
        info = self.call("read its info", self.client.info)
        backend = (info.get("host") or {}).get("networkBackend") if isinstance(info, dict) else None
        return str(backend) if backend else None
