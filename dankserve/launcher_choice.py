"""Whether a deployment runs under dankserve's launcher (docs/launcher.md): `launcher = "auto"` (pure).

The launcher takes the place of the command that starts vLLM: in a container it replaces the image's
entrypoint, in the process runtime it runs the executable's Python. That is right only when that
command is vLLM's own (`vllm serve`, the `vllm` script, a Python with vLLM): an entrypoint that does
more (a wrapper script, a shell) would be bypassed. `true` and `false` keep their meaning.

`auto` is the default. Where snapshots restore the deployment's restarts (`snapshot = "auto"` on the
process runtime, issue 41) the launcher is not used: a restore is several times faster than a launcher
boot, and a launcher's server (its child) is not captured.

Podman: the image's entrypoint is read from its config when the daemon ensures the image (its
`Config.Entrypoint`, runtime/podman/images.py; kept in the machine's state and handed here through
`DeploymentSettings.with_image_entrypoint`; `dankserve plan` reads it where the image is local and Podman
answers at once). Until then it is unknown, and the reason says it is read at boot. With `snapshot = "auto"`
a Podman deployment's restarts are restores of its whole container, faster than a launcher boot: `auto` leaves
the launcher off there and says so (`launcher = true` boots through it, and its whole container is captured).
`DeploymentSettings.uses_launcher` is the one answer the rest of dankserve reads (a leaf, so that the
settings can ask it).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Literal

LauncherSetting = bool | Literal["auto"]
RuntimeKind = Literal["podman", "process"]

# vLLM's own entrypoints: the vllm/vllm-openai images since 0.10 (`vllm serve`), the older ones
# (the OpenAI server module), and the `vllm` CLI itself.
_VLLM_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main")


def _is_python(word: str) -> bool:
    """As the process runtime tells a Python from a `vllm` script (process.serve_command)."""
    return PurePosixPath(word).name.startswith("python")


def _vllm_own(command: Sequence[str]) -> bool:
    if not command:
        return False
    head = PurePosixPath(command[0]).name
    if head == "vllm":
        return len(command) == 1 or command[1] == "serve"
    if _is_python(command[0]):
        rest = list(command[1:])
        return len(rest) == 0 or (len(rest) >= 2 and rest[0] == "-m" and rest[1] in _VLLM_MODULES)
    return False


def launcher_choice(
    setting: LauncherSetting,
    image_entrypoint: Sequence[str] | None,
    runtime_kind: RuntimeKind,
    *,
    snapshot: Literal["auto", "off"] = "off",
) -> tuple[bool, str]:
    """(use the launcher, why). `image_entrypoint`: the image's entrypoint (Podman), or the process
    runtime's `executable` split as a shell would; None when it could not be read."""
    if setting is True:
        return True, "launcher = true"
    if setting is False:
        return False, "launcher = false"
    if snapshot == "auto" and runtime_kind == "process":
        return False, (
            'launcher = auto: snapshot = "auto" restores this deployment\'s restarts (faster than a launcher '
            "boot; a launcher's server is not captured): set launcher = true to boot through it anyway"
        )
    if image_entrypoint is None and runtime_kind == "podman":
        return False, (
            "launcher = auto: the image's entrypoint is read from its config when the daemon ensures the image "
            "at boot; until then the launcher is not used (it could bypass what the entrypoint does)"
        )
    if image_entrypoint is None:
        return False, "launcher = auto: the executable could not be read, so the launcher could bypass what it does"
    shown = shlex.join(image_entrypoint) or "(none)"
    if runtime_kind == "process":
        if _vllm_own(image_entrypoint[:1]):
            return True, f"launcher = auto: the process runtime runs vLLM's own `{shown}`"
        return False, (
            f"launcher = auto: the executable `{shown}` is neither the `vllm` script nor a Python; the launcher "
            "would bypass what it does (set launcher = true to use it anyway)"
        )
    if _vllm_own(image_entrypoint) and snapshot == "auto":
        return False, (
            f"launcher = auto: the image's entrypoint `{shown}` is vLLM's own, but snapshot = \"auto\" restores this "
            "deployment's restarts from its container's snapshot (faster than a launcher boot): set launcher = true "
            "to boot through it too (its whole container is then captured and restored)"
        )
    if _vllm_own(image_entrypoint):
        return True, f"launcher = auto: the image's entrypoint `{shown}` is vLLM's own"
    return False, (
        f"launcher = auto: the image's entrypoint `{shown}` is not vLLM's own; the launcher would bypass it "
        "(set launcher = true to use it anyway)"
    )
