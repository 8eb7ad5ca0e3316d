"""The exceptions dankserve raises for failures a user can cause or fix.

Every one carries a message naming the problem and the offending value, a `fix` telling the
user what to do, and the exit code the CLI ends with::

    DankserveError                      (never raised itself)
    ├── InvalidInput                    exit 2
    │   ├── ConfigError                 the TOML file, DANKSERVE_* env or a setting's value
    │   ├── HardwareFileError           a recorded-host file (--hardware) that cannot be read
    │   ├── UnknownValueError           a value outside a known set (e.g. --kv-cache-dtype q8_0)
    │   ├── ModelNotFound               the Hub has no such model or revision (or hides a private one)
    │   └── ModelAccessDenied           a gated or private model and no token that may read it
    ├── EnvironmentUnusable             exit 3
    │   ├── NvmlUnavailable             no NVIDIA driver / NVML library, or no GPU
    │   ├── PodmanUnreachable           the Podman REST API does not answer
    │   ├── PodmanRequestFailed         a Podman request refused (port in use, ...); transient when Podman
    │   │                               failed it (5xx) or did not answer in time
    │   ├── ImageUnavailable            the image is absent and the pull policy or the pull failed
    │   ├── GpuPassthroughUnavailable   an assigned GPU has neither a CDI entry nor a device node
    │   ├── MissingTool                 a system program dankserve needs is absent
    │   ├── DaemonResourcesExhausted    the daemon itself is out of file descriptors or memory
    │   ├── HubUnreachable              the Hub does not answer (or offline mode) and nothing is cached
    │   │   └── HubAnswerRefused        it answered what dankserve will not write (a commit id or file
    │   │                               name that is not a plain path, bytes that do not match the listing)
    │   ├── DiskSpaceShortfall          too little free disk for a model's weights
    │   └── ClusterUnreachable          a multi-host group cannot be reached or formed (retried like
    │       │                           a Podman outage: never counted as a failure of the deployment)
    │       ├── MemberUnreachable       a group member did not answer (or answered garbage)
    │       └── GroupNotFormed          Ray did not show every member in time
    ├── InfeasiblePlan                  exit 4: cannot run on this host as configured
    ├── DeploymentFailed                exit 5: a deployment `up`/`wake` waited for failed (the daemon gave up)
    └── TimedOut                        exit 6: `up --timeout` ran out before every deployment rested

Anything else escaping to the CLI is a bug: exit 1, traceback only with ``--debug``. `transient` says
which errors the supervisor waits out (the Unreachable ones, and a Podman request not answered).
"""

from __future__ import annotations

import errno

from dankserve.exitcodes import ExitCode


class DankserveError(Exception):
    """Base of every error dankserve reports to a user."""

    exit_code: ExitCode = ExitCode.INTERNAL
    transient: bool = False
    """Worth trying again later: the fault is one that passes by itself (a service or a host that does not
    answer now), not the deployment's or the configuration's. The supervisor waits and tries again, counting
    no failure; anything else fails the deployment. httpx groups its exceptions by what the caller can do
    the same way (`TransportError`). A class sets it for all of its errors; `transient=` for one."""

    def __init__(self, message: str, *, fix: str | None = None, transient: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        if transient is not None:
            self.transient = transient

    def render(self) -> str:
        """The text the CLI prints: the message, then the fix on its own line."""
        if self.fix:
            return f"{self.message}\n  fix: {self.fix}"
        return self.message


class InvalidInput(DankserveError):
    """Arguments, configuration or an input file are invalid (exit 2)."""

    exit_code = ExitCode.INVALID_INPUT


class ConfigError(InvalidInput):
    """The configuration file, a DANKSERVE_* variable or a setting value is invalid."""


class HardwareFileError(InvalidInput):
    """A recorded-host file is unreadable, not JSON, or does not match the schema."""


class UnknownValueError(InvalidInput):
    """A value is not one of the values the target accepts."""


class EnvironmentUnusable(DankserveError):
    """The host environment cannot run dankserve's job (exit 3)."""

    exit_code = ExitCode.ENVIRONMENT


class NotTheDaemonsUser(EnvironmentUnusable):
    """The daemon's files (its state dir, control socket, snapshots) belong to the user it runs as, and this
    command runs as another: the fix is the same wherever it is met."""

    FIX = "run dankserve as the user its daemon runs as (root for the systemd unit: `sudo dankserve ...`)"

    def __init__(self, message: str) -> None:
        super().__init__(message, fix=self.FIX)


class NvmlUnavailable(EnvironmentUnusable):
    """NVML cannot be loaded or initialised, or it sees no GPU."""


class PodmanUnreachable(EnvironmentUnusable):
    """The Podman REST API at the configured URL does not answer."""

    transient = True


class PodmanRequestFailed(EnvironmentUnusable):
    """A Podman request failed: Podman refused it (4xx: not transient), failed it (5xx after the retries) or did
    not answer in time (both transient: the service is busy, paused or restarting)."""


class ImageUnavailable(EnvironmentUnusable):
    """The image is not present locally and may not, or could not, be pulled."""


class GpuPassthroughUnavailable(EnvironmentUnusable):
    """An assigned GPU cannot be handed to the container: no CDI spec entry and no device node."""


class MissingTool(EnvironmentUnusable):
    """A system program that dankserve needs is not installed."""


class ModelNotFound(InvalidInput):
    """The Hub knows no such model repo or revision (private repos look the same without a token)."""


class ModelAccessDenied(InvalidInput):
    """A gated or private model, and no token (hf_token_file) that may read it."""


class HubUnreachable(EnvironmentUnusable):
    """The Hugging Face Hub cannot be reached (or offline mode is on) and the model is not cached."""

    transient = True


class HubAnswerRefused(HubUnreachable):
    """The Hub (or the mirror HF_ENDPOINT names) answered something dankserve does not write to disk:
    a commit id that is not 40 hex digits, a file name or ETag that is not a plain relative path, a
    file longer than or different from what the listing says. Treated like a Hub that does not answer."""


class DiskSpaceShortfall(EnvironmentUnusable):
    """The file system of the HF cache has less free space than the download needs."""


class InfeasiblePlan(DankserveError):
    """The deployment cannot run on this host as configured (exit 4)."""

    exit_code = ExitCode.INFEASIBLE


class DeploymentFailed(DankserveError):
    """A deployment the command waited for failed: the daemon gave up on it (exit 5)."""

    exit_code = ExitCode.DEPLOYMENT_FAILED


class TimedOut(DankserveError):
    """The command's wait ran out before the deployments rested; the daemon keeps trying (exit 6)."""

    exit_code = ExitCode.TIMED_OUT


class ClusterUnreachable(EnvironmentUnusable):
    """A multi-host group could not be reached or formed; the daemon retries it with backoff."""

    transient = True


class MemberUnreachable(ClusterUnreachable):
    """A group member did not answer (or answered garbage)."""


class GroupNotFormed(ClusterUnreachable):
    """Ray did not show every member of a group in time."""


class DaemonResourcesExhausted(EnvironmentUnusable):
    """The daemon itself ran out of file descriptors or memory (EMFILE, ENFILE, ENOMEM, ENOBUFS).

    Never a deployment's fault: the supervisor retries like a Podman outage, counting no failure."""


OWN_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})


def resources_exhausted(exc: BaseException) -> DaemonResourcesExhausted | None:
    """The exhaustion behind `exc` (itself, or an error it was raised from), or None when it is another error."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DaemonResourcesExhausted):
            return current
        if isinstance(current, MemoryError) or (isinstance(current, OSError) and current.errno in OWN_RESOURCE_ERRNOS):
            return DaemonResourcesExhausted(
                f"the daemon itself is out of resources ({type(current).__name__}: {current}); retrying",
                fix="raise LimitNOFILE in the unit or free memory; the deployments are not at fault",
            )
        current = current.__cause__ or current.__context__
    return None
