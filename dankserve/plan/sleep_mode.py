"""vLLM's sleep mode in a plan (`--enable-sleep-mode`, with dev mode where its routes are needed): for a swap
group's member, which sleeps instead of stopping, and for `snapshot = "auto"`, whose capture empties the GPU
first. Pure: each answers the flag's reason (None: no flag), the env it needs, and what to tell the user."""

from __future__ import annotations

from dankserve.plan.catalogue import VllmCapabilities
from dankserve.plan.exposure import DEV_MODE_ENV
from dankserve.settings import DeploymentSettings

SLEEP_MODE_FLAG = "--enable-sleep-mode"


def has_sleep_mode(deployment: DeploymentSettings) -> bool:
    """A swap group member that sleeps through vLLM's sleep mode (and so runs in dev mode, on loopback)."""
    return deployment.swap_group is not None and deployment.sleep_level != "stop"


def for_swap(deployment: DeploymentSettings, caps: VllmCapabilities) -> tuple[str | None, dict[str, str], list[str]]:
    """A swap group's member gets vLLM's sleep mode and its dev-mode routes, where its release has them."""
    if not has_sleep_mode(deployment):
        return None, {}, []
    if not caps.has(SLEEP_MODE_FLAG):
        return (
            None,
            {},
            [
                f"vLLM {caps.version} has no {SLEEP_MODE_FLAG}: swap group {deployment.swap_group!r} swaps this "
                "deployment by stopping it and booting it again"
            ],
        )
    reason = f"swap group {deployment.swap_group!r}: sleeps instead of stopping when another member needs its GPUs"
    return reason, {DEV_MODE_ENV: "1"}, []


def for_snapshot(
    deployment: DeploymentSettings, caps: VllmCapabilities, socket: str | None, tensor_parallel: int
) -> tuple[str | None, dict[str, str], str | None]:
    """`snapshot = "auto"` (one GPU: a snapshot's limit) gets vLLM's sleep mode, so that the capture can empty
    the GPU first: asleep at level 2 (or prepared through 0.34's checkpoint routes, the weights kept) the
    snapshot holds a few GiB, not the GPU's whole memory. Found on an H100 with real vLLM: without it an 8B's
    checkpoint moved 74 GB (weights and KV cache) into the image, over any sensible disk budget. The sleep
    routes need dev mode, which opens /collective_rpc to whoever reaches the server: on for a private socket
    only. The third item is a note (None: nothing to say)."""
    if has_sleep_mode(deployment) or deployment.snapshot != "auto" or tensor_parallel != 1:
        return None, {}, None
    if not caps.has(SLEEP_MODE_FLAG):
        return None, {}, f"snapshot: vLLM {caps.version} has no {SLEEP_MODE_FLAG}: a capture holds the GPU's memory"
    if socket is not None:
        reason = "snapshot = auto: the capture sleeps the server at level 2 first (a few GiB kept, not its GPU memory)"
        return reason, {DEV_MODE_ENV: "1"}, None
    if caps.checkpoint_routes:
        reason = "snapshot = auto: the capture prepares the server through vLLM's checkpoint routes (KV cache freed)"
        return reason, {}, None
    return (
        None,
        {},
        "snapshot: the server listens on TCP, so the capture cannot sleep it (vLLM's sleep routes need dev mode, "
        "which would open /collective_rpc to whoever reaches the port): a snapshot holds its weights and KV cache, "
        'and a capture over snapshot_max_bytes or the free disk is refused; listen = "socket" with a [gateway] '
        "lets it sleep first",
    )
