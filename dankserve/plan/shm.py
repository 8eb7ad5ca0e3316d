"""A Podman container's /dev/shm: the host's (ipc=host) or a private tmpfs of a chosen size (pure; issue 41).

vLLM needs a large /dev/shm (its shm message queue between the API server and the engine core, PyTorch's
tensors between processes, the multimodal processor cache); Podman's own default is 64 MB. vLLM's docs say
to run its image with `--ipc=host` or a large `--shm-size`. A container sharing the host's IPC namespace
cannot be snapshotted (Podman 4.3 would save the host's whole /dev/shm with it and unpack it over the
host's at restore: docs/snapshots.md, Podman), so a deployment whose snapshots are on gets a private
/dev/shm by default, as large as the host's own: half the host's RAM, as the kernel sizes a tmpfs by default.
A tmpfs's size is a ceiling, not an allocation: pages are taken only as segments are written, so the ceiling
takes nothing from the host until used, and vLLM finds no less room than under ipc=host.
"""

from __future__ import annotations

from dankserve.plan.rules import GIB, Decision, gib
from dankserve.settings import DeploymentSettings

HOST_IPC = "host"
"""`shm_size = "host"`: the host's IPC namespace and /dev/shm (ipc=host), whatever the snapshot setting."""
FLOOR_BYTES = GIB
"""The least a private /dev/shm gets (a host whose RAM is unknown or tiny): vLLM's queue and locks fit."""
SHARED_REASON = (
    "the container shares the host's /dev/shm (ipc=host): Podman 4.3 would save the host's whole /dev/shm "
    'with it and unpack it over the host\'s at restore; leave shm_size unset or set a size (e.g. "16g")'
)
"""Why a container on the host's IPC namespace has no snapshot (the verdict and the doctor say it)."""


def private_default(host_ram_bytes: int) -> str:
    """The default private /dev/shm size, in Podman's notation (MiB): half the host's RAM, at least the floor."""
    return f"{max(host_ram_bytes // 2, FLOOR_BYTES) >> 20}m"


def shares_host_ipc(dep: DeploymentSettings) -> bool:
    """The deployment's container runs on the host's IPC namespace (ipc=host): `shm_size = "host"`, or unset
    where snapshots are off (the default before snapshots, and vLLM's own recommendation)."""
    return dep.shm_size == HOST_IPC or (dep.shm_size is None and dep.snapshot == "off")


def shm_choice(dep: DeploymentSettings, host_ram_bytes: int) -> Decision[str | None]:
    """The container's /dev/shm size (None: ipc=host) and why; only a Podman deployment has one to choose."""
    if dep.shm_size == HOST_IPC:
        return Decision(None, 'shm_size = "host": the host\'s IPC namespace and /dev/shm (ipc=host); no snapshots')
    if dep.shm_size is not None:
        return Decision(dep.shm_size, "set in config (shm_size): a private /dev/shm of that size")
    if dep.snapshot == "off":
        return Decision(None, 'the host\'s /dev/shm (ipc=host, as vLLM recommends; snapshot = "off")')
    size = private_default(host_ram_bytes)
    return Decision(
        size,
        f"a private /dev/shm of {gib(int(size[:-1]) << 20)} (half the host's RAM, as large as the host's own; a "
        'ceiling, not an allocation): a snapshot must not carry the host\'s /dev/shm (snapshot = "auto")',
    )


def shm_note(dep: DeploymentSettings, host_ram_bytes: int) -> str | None:
    """The plan's note of the choice (None: not a container)."""
    if dep.runtime != "podman":
        return None
    choice = shm_choice(dep, host_ram_bytes)
    return f"/dev/shm: {choice.value or 'ipc=host'} ({choice.reason})"


def fingerprinted(dep: DeploymentSettings) -> dict[str, str]:
    """What the plan's fingerprint adds: a container given the default private /dev/shm (snapshots on, shm_size
    unset) is another container than the ipc=host one an older dankserve started, so it is replaced once rather
    than adopted; every other deployment keeps its fingerprint (adopted)."""
    default_private = dep.runtime == "podman" and dep.shm_size is None and not shares_host_ipc(dep)
    return {"shm_size": "private"} if default_private else {}
