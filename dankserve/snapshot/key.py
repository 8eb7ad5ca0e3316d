"""A snapshot's identity: everything that, when changed, makes a restored server wrong.

A restore brings back a process's memory as it was, so anything the memory was built from must
be the same now: the plan's argv and env, the image, the driver, the GPU, the kernel, CRIU and
dankserve themselves, and the weights' files. One frozen value; `invalid_reason` compares two.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, fields


@dataclass(frozen=True, slots=True)
class WeightsFile:
    """One file of the model's weights as the file system describes it (hashing 16 GB would cost
    more than the restore saves; a changed file changes its size or mtime)."""

    name: str
    size: int
    mtime_ns: int


@dataclass(frozen=True, slots=True)
class SnapshotKey:
    """What a snapshot was captured from. Equal keys: the snapshot may be restored."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    secrets: str
    """The digest of the deployment's secret files (`secrets_digest`): a server restored holds the key and the
    token it read at capture, so a changed file must not restore it."""
    image_digest: str
    vllm_version: str
    driver_version: str
    gpu_model: str
    gpu_uuid: str
    kernel_release: str
    criu_version: str
    dankserve_version: str
    weights: tuple[WeightsFile, ...]

    @staticmethod
    def of(
        *,
        argv: tuple[str, ...],
        env: dict[str, str],
        image_digest: str,
        vllm_version: str,
        driver_version: str,
        gpu_model: str,
        gpu_uuid: str,
        kernel_release: str,
        criu_version: str,
        dankserve_version: str,
        weights: tuple[WeightsFile, ...],
        secrets: str = "",
    ) -> SnapshotKey:
        """A key in canonical order (env and weights sorted), so that equal inputs compare equal
        whatever order a dict or a directory listing gave them in."""
        return SnapshotKey(
            argv=argv,
            env=tuple(sorted(env.items())),
            secrets=secrets,
            image_digest=image_digest,
            vllm_version=vllm_version,
            driver_version=driver_version,
            gpu_model=gpu_model,
            gpu_uuid=gpu_uuid,
            kernel_release=kernel_release,
            criu_version=criu_version,
            dankserve_version=dankserve_version,
            weights=tuple(sorted(weights, key=lambda w: w.name)),
        )


# What a user reads when a field differs: the field's name is not always self-explaining.
_LABELS = {
    "argv": "the plan's arguments",
    "env": "the server's environment",
    "secrets": "the secret files' contents (hf_token_file, api_key_file)",
    "image_digest": "the image digest",
    "vllm_version": "the vLLM version",
    "driver_version": "the NVIDIA driver version",
    "gpu_model": "the GPU model",
    "gpu_uuid": "the GPU (UUID)",
    "kernel_release": "the kernel release",
    "criu_version": "the CRIU version",
    "dankserve_version": "the dankserve version",
    "weights": "the model weights' files",
}

# Values that may hold a secret (env: the HF token) are never shown in a reason.
_HIDDEN = frozenset({"env", "argv", "secrets"})


def invalid_reason(stored: SnapshotKey, current: SnapshotKey) -> str | None:
    """None when `stored` may be restored for `current`, else why not (the first difference,
    in the order of the fields: the plan first, the weights last)."""
    for field in fields(SnapshotKey):
        was = getattr(stored, field.name)
        now = getattr(current, field.name)
        if was == now:
            continue
        label = _LABELS[field.name]
        if field.name in _HIDDEN:
            return f"{label} changed since the capture"
        if field.name == "weights":
            return f"{label} changed since the capture: {_weights_change(was, now)}"
        return f"{label} changed since the capture: {was!r} then, {now!r} now"
    return None


def _weights_change(was: tuple[WeightsFile, ...], now: tuple[WeightsFile, ...]) -> str:
    before = {w.name: w for w in was}
    after = {w.name: w for w in now}
    gone = sorted(before.keys() - after.keys())
    new = sorted(after.keys() - before.keys())
    changed = sorted(n for n in before.keys() & after.keys() if before[n] != after[n])
    parts = []
    if gone:
        parts.append("gone " + ", ".join(gone[:3]) + (" …" if len(gone) > 3 else ""))
    if new:
        parts.append("new " + ", ".join(new[:3]) + (" …" if len(new) > 3 else ""))
    if changed:
        parts.append("changed " + ", ".join(changed[:3]) + (" …" if len(changed) > 3 else ""))
    return "; ".join(parts)


def secrets_digest(values: Sequence[tuple[str, bytes]]) -> str:
    """One digest of the secrets' names and contents ("" for none): kept in the manifest beside the image that
    holds the values themselves (the server's memory), never shown."""
    if not values:
        return ""
    digest = hashlib.sha256()
    for name, value in sorted(values):
        digest.update(f"{name}\0{len(value)}\0".encode() + value)
    return "sha256:" + digest.hexdigest()
