"""The checks behind `dankserve doctor`: each reads one thing and says ok, warn or fail, and the fix.

Pure verdict functions over readings; the readers are thin edges at the bottom.
"""

from __future__ import annotations

import glob
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Verdict = Literal["ok", "warn", "fail"]
CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
# NVIDIA driver versions as nvidia-ctk writes them into a spec (libcuda.so.570.86.15, driver dirs).
_DRIVER_VERSION = re.compile(r"(?<!\d)(\d{3}\.\d{2,3}(?:\.\d{1,3})?)(?!\d)")
# conmon runs `podman container cleanup` when a container dies with only this PATH: the CNI plugins
# it calls need iptables there, or the dead container's port forward stays behind.
DEFAULT_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report."""

    name: str
    verdict: Verdict
    detail: str
    fix: str | None = None


def cdi_verdict(spec_texts: dict[str, str], driver_version: str | None) -> Check:
    """A CDI spec must list nvidia.com/gpu devices, made for the installed driver.

    A spec that names driver versions (nvidia-ctk's do: libcuda.so.VERSION) must name the installed
    one; a spec that names none (it mounts the driver's directory as a whole) fits any driver.
    """
    specs = {path: text for path, text in spec_texts.items() if "nvidia.com/gpu" in text or "kind: nvidia.com" in text}
    fix = (
        "install the NVIDIA Container Toolkit (it provides nvidia-ctk), then "
        "`nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml` (again after every driver update)"
    )
    if not specs:
        return Check("cdi", "warn", "no CDI spec lists nvidia.com/gpu: device nodes will be passed instead", fix)
    named = {version for text in specs.values() for version in _DRIVER_VERSION.findall(text)}
    if driver_version and named and driver_version not in named:
        paths = ", ".join(sorted(specs))
        made_for = ", ".join(sorted(named))
        return Check(
            "cdi", "fail", f"CDI spec {paths} was made for driver {made_for}, not the installed {driver_version}", fix
        )
    note = "" if named else " (names no driver version: it fits any driver)"
    return Check("cdi", "ok", f"CDI spec {', '.join(sorted(specs))}{note}")


def cni_iptables_verdict(network_backend: str | None, iptables: str | None) -> Check | None:
    """Podman's CNI backend needs iptables on the default PATH (None: not CNI, nothing to check).

    Seen on a real host: with iptables only on the service's own PATH, a killed container's port
    forward was never removed, so its replacement answered nothing on the published port.
    """
    if network_backend != "cni":
        return None
    if iptables is not None:
        return Check("podman network", "ok", f"CNI, iptables at {iptables}")
    return Check(
        "podman network",
        "fail",
        f"Podman uses CNI but iptables is not on the default PATH ({DEFAULT_PATH}): a dead container's "
        "port forward would stay behind and its replacement's published port would answer nothing",
        "install iptables (Debian/Ubuntu: `apt-get install iptables`) so that /usr/sbin/iptables exists",
    )


def disk_verdict(path: Path, free_bytes: int | None, needed_bytes: int | None, read_at: Path | None = None) -> Check:
    """Free disk where a cache lives: enough for the model when its size is known, else 20 GiB. `read_at`:
    the nearest existing directory above a `path` that does not exist yet (its free space is the one read)."""
    if free_bytes is None:
        return Check(f"disk {path}", "warn", "cannot read free space")
    want = needed_bytes if needed_bytes else 20 * 2**30
    detail = f"{free_bytes / 2**30:.1f} GiB free"
    if read_at is not None and read_at != path:
        detail += f" on {read_at} (the directory does not exist yet: dankserve creates it at its first start)"
    if free_bytes < want:
        return Check(f"disk {path}", "fail", f"{detail}, need {want / 2**30:.1f} GiB", f"free space under {path}")
    return Check(f"disk {path}", "ok", detail)


def podman_service_fix(socket_url: str, systemd: bool) -> str:
    """How to start Podman's API service at `socket_url`: its socket unit under systemd, else by hand."""
    if systemd:
        return "start its API socket: `systemctl enable --now podman.socket`"
    return (
        f"this host runs no systemd (no podman.socket unit to start): run the API service yourself, "
        f"`podman system service --time=0 {socket_url} &` (as the user dankserve runs as), or set podman_url"
    )


def podman_tool_verdict(
    found: str | None, socket_url: str = "unix:///run/podman/podman.sock", systemd: bool = True
) -> Check | None:
    """A failing check when the podman program is absent (a local socket then cannot exist), else None."""
    if found is not None:
        return None
    return Check(
        "podman",
        "fail",
        "podman is not installed",
        "install Podman (Debian/Ubuntu: `apt-get install podman`; Fedora/RHEL: `dnf install podman`), "
        f"then {podman_service_fix(socket_url, systemd)}",
    )


def gpu_devices_verdict(deployment: str, mode: str | None, missing: str | None, recorded: bool) -> Check:
    """Whether a Podman deployment's GPUs can reach its container on this host: a CDI entry or a device node
    each (`mode`, as the runtime would choose), or what is `missing` (its `up` would fail to create the
    container). `recorded`: the GPUs are a recorded host's (the driver was not asked)."""
    name = f"GPU devices for {deployment}"
    if missing is None:
        return Check(name, "ok", f"passed as {mode}")
    where = " (the GPUs are a recorded host's, but the container needs devices of this one)" if recorded else ""
    fix = (
        "on a GPU host: `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`, or load the NVIDIA driver; "
        "to try Podman deployments without a GPU: `make try-it-podman` (stand-in GPU nodes, their CDI spec and "
        "a private Podman service; docs/TRY-IT.md)"
    )
    return Check(name, "warn", f"{missing}: `dankserve up {deployment}` would fail here{where}", fix)


def device_node_verdict(nodes: Iterable[str]) -> Check:
    """/dev/nvidiactl and at least one /dev/nvidiaN must exist."""
    present = sorted(nodes)
    has_gpu = any(Path(n).name.removeprefix("nvidia").isdigit() for n in present)
    if "/dev/nvidiactl" in present and has_gpu:
        return Check("device nodes", "ok", " ".join(present))
    return Check(
        "device nodes",
        "fail",
        f"missing /dev/nvidiactl or /dev/nvidiaN (found: {' '.join(present) or 'none'})",
        "install the NVIDIA driver and load its modules (nvidia-smi should list the GPUs)",
    )


# -- readers (edges) ------------------------------------------------------------------------------


KERNEL_PACKAGES = ("flashinfer_cubin", "flashinfer_jit_cache")
"""What `vllm download-kernels` installs (FlashInfer's precompiled kernels); missing ones FlashInfer fetches or
compiles when the server starts (vllm/utils/flashinfer.py warn_if_flashinfer_kernels_missing)."""


def kernels_verdict(deployment: str, version: str, kernels_dir: Path, present: Iterable[str]) -> Check:
    """The kept kernels of a deployment whose vLLM has `vllm download-kernels`: those its next start would fetch."""
    missing = [name for name in KERNEL_PACKAGES if name not in set(present)]
    name = f"kernels for {deployment}"
    if not missing:
        return Check(name, "ok", f"vLLM {version}'s FlashInfer kernels kept in {kernels_dir}")
    fetched = ", ".join(m.replace("_", "-") for m in missing)
    return Check(
        name,
        "warn",
        f"vLLM {version} would fetch {fetched} at start (not kept in {kernels_dir}): downloaded, or compiled where "
        "the host is offline, each time a container starts",
        f"let the next boot reach the package index once (its first-boot step runs `vllm download-kernels` into "
        f"{kernels_dir}), or install them there yourself: PIP_TARGET={kernels_dir} vllm download-kernels",
    )


def read_kernel_packages(kernels_dir: Path) -> list[str]:
    """The kernel packages a kept kernels dir holds (none when it is missing or unreadable)."""
    try:
        return sorted(entry.name for entry in kernels_dir.iterdir() if entry.is_dir())
    except OSError:
        return []


def read_cdi_specs(dirs: Iterable[Path] = CDI_DIRS) -> dict[str, str]:
    out = {}
    for directory in dirs:
        for path in sorted(directory.glob("*.yaml")) + sorted(directory.glob("*.json")):
            try:
                out[str(path)] = path.read_text(errors="replace")
            except OSError:
                continue
    return out


def read_device_nodes() -> list[str]:
    return glob.glob("/dev/nvidia*")


def existing_dir(path: Path) -> Path:
    """`path`, or the nearest directory above it that exists (where a new one would be created)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def free_disk(path: Path) -> int | None:
    try:
        return shutil.disk_usage(existing_dir(path)).free
    except OSError:
        return None


def runs_systemd() -> bool:
    """systemd is this host's init (sd_booted(3): /run/systemd/system exists)."""
    return Path("/run/systemd/system").is_dir()


# Snapshots (issue 41, docs/snapshots.md): CRIU 4.2 is the first that dumps a TCP socket on kernels
# >= 6.16; CAP_SYS_ADMIN (21) or CAP_CHECKPOINT_RESTORE (40) lets it read and rebuild a process.
CRIU_MIN_VERSION = (4, 2)
_CAP_SYS_ADMIN = 21
_CAP_CHECKPOINT_RESTORE = 40


@dataclass(frozen=True)
class CriuReading:
    """What the snapshot check reads: CRIU (path, version, `criu check`), the kernel, the caps."""

    path: str | None
    version: str | None
    check_ok: bool
    check_reason: str
    kernel_release: str
    effective_caps: int


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def snapshot_verdict(
    reading: CriuReading, *, wanted: bool, multi_gpu: Iterable[str] = (), gpu_missing: tuple[str, str] | None = None
) -> Check:
    """Whether snapshots can work here, and why not. Never a fail: `snapshot = "auto"` falls back
    to a plain boot, so a host without them still serves (slower restarts). `wanted`: some
    deployment has `snapshot = "auto"` (or none is configured yet); else the check says they are off.
    `gpu_missing`: what the GPU checkpoint lacks here and its fix (cuda-bindings, the `[snapshot]` extra),
    said beside CRIU's own verdict."""
    if not wanted:
        return Check("snapshots", "ok", 'off (snapshot = "off" for every deployment)')
    check = _criu_verdict(reading, multi_gpu)
    if gpu_missing is None:
        return check
    what, fix = gpu_missing
    if check.verdict == "ok":
        return Check("snapshots", "warn", f"off: {what} (the GPU checkpoint needs it); {check.detail}", fix)
    both = f"{check.fix}; then {fix}" if check.fix else fix
    return Check("snapshots", "warn", f"{check.detail}; and {what} (the GPU checkpoint needs it)", both)


def _criu_verdict(reading: CriuReading, multi_gpu: Iterable[str]) -> Check:
    bad: Verdict = "warn"
    build = "run `make system-deps` as root (builds CRIU 4.2.1 from Debian's source package)"
    if reading.kernel_release.startswith("4.4.0"):
        return Check(
            "snapshots",
            bad,
            f"kernel {reading.kernel_release} looks like gVisor (runsc): CRIU cannot run in it",
            'run dankserve on a VM or bare-metal kernel, or set snapshot = "off"',
        )
    if reading.path is None:
        return Check("snapshots", bad, "CRIU is not installed: restarts will boot from scratch", build)
    if reading.version is None or _version_tuple(reading.version) < CRIU_MIN_VERSION:
        found = reading.version or "unknown"
        return Check("snapshots", bad, f"CRIU {found} at {reading.path} is older than 4.2 (TCP sockets fail)", build)
    caps = reading.effective_caps
    if not (caps >> _CAP_SYS_ADMIN & 1 or caps >> _CAP_CHECKPOINT_RESTORE & 1):
        return Check(
            "snapshots",
            bad,
            "neither CAP_SYS_ADMIN nor CAP_CHECKPOINT_RESTORE is held: CRIU cannot dump or restore",
            "run the daemon as root (the systemd unit does)",
        )
    if not reading.check_ok:
        return Check(
            "snapshots",
            bad,
            f"`criu check` fails on kernel {reading.kernel_release}: {reading.check_reason}",
            'use a kernel CRIU supports (docs/snapshots.md), or set snapshot = "off"',
        )
    tp = sorted(multi_gpu)
    if tp:
        return Check(
            "snapshots",
            "warn",
            f"CRIU {reading.version} works here, but {', '.join(tp)} use more than one GPU (TP > 1): "
            "NCCL cannot be checkpointed, they boot from scratch",
        )
    return Check("snapshots", "ok", f"CRIU {reading.version} at {reading.path}: `criu check` passes")


def read_criu(path: str | None, timeout_s: float = 30.0) -> CriuReading:
    """Runs `criu --version` and `criu check` of the binary at `path` (None: none found; the one
    finder is `snapshot.criu.find_criu`), bounded; reads the kernel release and our caps."""
    import os
    import subprocess

    kernel = os.uname().release
    caps = 0
    try:
        for line in Path("/proc/self/status").read_text(errors="replace").splitlines():
            if line.startswith("CapEff:"):
                caps = int(line.split()[1], 16)
    except (OSError, ValueError):
        caps = 0
    if path is None:
        return CriuReading(None, None, False, "", kernel, caps)
    version: str | None = None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=timeout_s, check=False)
        found = re.search(r"Version:\s*(\S+)", out.stdout)
        version = found.group(1) if found else None
        check = subprocess.run([path, "check"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return CriuReading(path, version, False, str(exc), kernel, caps)
    lines = [ln.strip() for ln in (check.stderr + check.stdout).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "rror" in ln] or lines
    reason = (errors[-1] if errors else f"exit status {check.returncode}")[:300]
    return CriuReading(path, version, check.returncode == 0, reason, kernel, caps)


def podman_snapshot_verdict(podman_says: str | None, criu: str | None, blocked: dict[str, str]) -> Check:
    """Whether Podman's checkpoints can work for the deployments that want snapshots: Podman's runc runs the
    `criu` on the service's PATH (Podman 4.3's `podman info` says nothing of CRIU; newer ones do, quoted
    here), and each deployment Podman cannot checkpoint (`blocked`: its reason). Never a fail."""
    says = f"`podman info`: {podman_says}" if podman_says else "`podman info` says nothing of CRIU (Podman 4.3)"
    if criu is None:
        return Check(
            "podman snapshots",
            "warn",
            f"no CRIU for Podman's checkpoints ({says}): restarts boot from scratch",
            "run `make system-deps` as root (CRIU 4.2.1 in /usr/local/sbin, on the Podman service's PATH)",
        )
    if blocked:
        named = "; ".join(f"{name}: {why}" for name, why in sorted(blocked.items()))
        return Check("podman snapshots", "warn", f"not captured: {named}", "see docs/snapshots.md, Podman")
    return Check("podman snapshots", "ok", f"Podman's checkpoints run CRIU at {criu} ({says})")
