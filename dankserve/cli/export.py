"""`dankserve export quadlet NAME [-o FILE] [--force] [--hardware FILE] [--vllm-version V] [--devices MODE]`.

Prints (or writes) the Podman Quadlet `.container` unit that runs the deployment as dankserve's
Podman runtime would: planned by the same `plan_one`, turned into the same workload spec and
container create request (runtime/podman/quadlet.py renders it). Nothing is started.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import click

from dankserve.cli.context import cli_context
from dankserve.cli.options import complete_deployment, hardware_option
from dankserve.errors import ConfigError, InvalidInput
from dankserve.exitcodes import ExitCode

if TYPE_CHECKING:
    from dankserve.runtime.base import GpuRef
    from dankserve.runtime.podman.cdi import GpuPassthrough
    from dankserve.settings import DeploymentSettings, Settings

DeviceMode = Literal["auto", "cdi", "nodes"]
UNIT_MODE = 0o644


@click.command("export")
@click.argument("format_", metavar="FORMAT", type=click.Choice(["quadlet"]))
@click.argument("deployment", shell_complete=complete_deployment)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write the unit to FILE (atomically, mode 0644) instead of printing it; an existing FILE needs --force.",
)
@click.option("--force", is_flag=True, help="Replace an existing --output FILE.")
@hardware_option
@click.option("--vllm-version", default=None, help="Plan for this vLLM release (default: the image tag's).")
@click.option(
    "--devices",
    type=click.Choice(["auto", "cdi", "nodes"]),
    default="auto",
    show_default=True,
    help="GPU passthrough: auto = as the runtime chooses on this host (CDI when a spec names every GPU, else "
    "the device nodes); cdi = AddDevice=nvidia.com/gpu=UUID; nodes = /dev/nvidiaN and the control nodes "
    "(for a unit written for another host).",
)
def command(
    *,
    format_: str,
    deployment: str,
    output: Path | None,
    force: bool,
    hardware: Path | None,
    vllm_version: str | None,
    devices: DeviceMode,
) -> ExitCode:
    """Print a deployment as a Podman Quadlet unit, for plain systemd without dankserve.

    The unit runs the image with the same entrypoint, flags (Exec=), environment, mounts, GPU devices,
    ports, labels, IPC or shared memory and capabilities as dankserve's Podman runtime gives the
    container. Secrets are not written into it: it names Podman secrets (Secret=) and says how to create
    them from the deployment's files. A health check of vLLM's /health with Notify=healthy makes `systemctl
    start` return once the server serves; an image named by a registry and a tag gets AutoUpdate=registry.
    Needs Podman 5.0 or later (Quadlet's Entrypoint= and Notify=healthy): a warning says when this host's
    Podman cannot use the unit (Debian 12's 4.3 has no Quadlet at all).
    """
    settings = cli_context().load_settings()
    dep = export_deployment(settings, deployment)
    from dankserve.host.probe import load_host
    from dankserve.planning import plan_one
    from dankserve.runtime.podman.quadlet import Unrepresentable, container_unit, podman_version_problem, render_unit
    from dankserve.supervisor.worker.workload import workload_spec

    host = load_host(hardware, cache_dirs=lambda: [settings.cache_dir, settings.hf_cache_dir])
    plan = plan_one(settings, deployment, dep, host, vllm_version=vllm_version)
    # No dankserve gateway stands in front of the unit: it serves on TCP host:port, never on the private socket.
    # Podman secrets, not dankserve's files (a unit has no snapshots: podman/secret_mounts.py).
    spec = replace(workload_spec(plan, dep, settings, 1), socket=None, secrets_dir=None)
    gpu = gpu_passthrough(spec.gpus, devices)
    notes = [
        f"Planned for vLLM {plan.vllm_version} on GPU {', '.join(map(str, plan.gpu_indices)) or 'none'}"
        f" ({gpu.mode}); `dankserve plan {deployment}` gives the reason for each flag.",
        "vLLM profiles its KV cache at each start here (dankserve's learned bytes are not pinned).",
    ]
    if dep.uses_launcher:
        notes.append("launcher = true is dankserve's: this container runs `vllm serve` itself.")
    if settings.serves_on_socket(dep):
        notes.append(
            f"Under dankserve this server listens on a private unix socket behind the gateway; this unit has no "
            f"gateway, so it listens on {dep.host}:{spec.port}, where every local user reaches all its routes."
        )
    notes += [f"plan warning: {w}" for w in plan.warnings]
    try:
        unit = container_unit(
            spec, gpu, stop_timeout=settings.stop_timeout_seconds, boot_timeout=settings.boot_timeout_seconds
        )
        text = render_unit(
            unit, description=f"vLLM serving {plan.model} (dankserve deployment {deployment})", notes=notes
        )
    except Unrepresentable as exc:
        raise ConfigError(
            f"deployment {deployment!r} cannot be written as a Quadlet unit: {exc}",
            fix=f"change that value in [deployments.{deployment}] (extra_args, env, paths) and export again",
        ) from exc
    problem = podman_version_problem(local_podman_version())
    if problem is not None:  # the unit may well be for another host: said, not refused
        click.echo(f"warning: {problem}", err=True)
    if output is None:
        sys.stdout.write(text)
        return ExitCode.OK
    write_unit(output, text, force=force)
    click.echo(f"wrote {output}", err=True)
    return ExitCode.OK


def local_podman_version() -> tuple[int, ...] | None:
    """This host's `podman --version` as numbers (4.3.1 -> (4, 3, 1)); None without a podman that answers."""
    import re
    import shutil
    import subprocess

    found = shutil.which("podman")
    if found is None:
        return None
    try:
        done = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", done.stdout)
    return tuple(int(p) for p in match.groups() if p is not None) if match and done.returncode == 0 else None


def export_deployment(settings: Settings, name: str) -> DeploymentSettings:
    """The configured deployment a unit can run: a Podman one on this host."""
    dep = settings.deployments.get(name)
    if dep is None:
        known = ", ".join(sorted(settings.deployments)) or "none configured"
        raise ConfigError(f"no deployment named {name!r} (deployments: {known})", fix="name a configured deployment")
    if dep.runtime != "podman":
        raise ConfigError(
            f"deployments.{name}.runtime = {dep.runtime!r}: a Quadlet unit runs a container",
            fix='export a deployment of runtime = "podman"',
        )
    if dep.hosts:
        raise ConfigError(
            f"deployments.{name} spans hosts {dep.hosts}: a Quadlet unit runs one container on one host",
            fix="export a single-host deployment",
        )
    return dep


def gpu_passthrough(gpus: tuple[GpuRef, ...], mode: DeviceMode) -> GpuPassthrough:
    """The runtime's choice (`choose_gpu_passthrough`) over this host's CDI specs and nodes, or over the
    names a mode declares for another host."""
    from dankserve.errors import GpuPassthroughUnavailable
    from dankserve.runtime.podman.cdi import (
        CONTROL_NODES,
        DEFAULT_CDI_DIRS,
        choose_gpu_passthrough,
        present_device_nodes,
        read_cdi_device_names,
    )

    dev = Path("/dev")
    if mode == "cdi":
        return choose_gpu_passthrough(gpus, frozenset(g.uuid for g in gpus), frozenset(), dev)
    if mode == "nodes":
        nodes = frozenset({f"nvidia{g.index}" for g in gpus} | set(CONTROL_NODES))
        return choose_gpu_passthrough(gpus, frozenset(), nodes, dev)
    try:
        return choose_gpu_passthrough(gpus, read_cdi_device_names(DEFAULT_CDI_DIRS), present_device_nodes(dev), dev)
    except GpuPassthroughUnavailable as exc:
        raise GpuPassthroughUnavailable(
            exc.message, fix=f"{exc.fix}; or write the unit for the GPU host with --devices cdi or --devices nodes"
        ) from exc


def write_unit(path: Path, text: str, *, force: bool) -> None:
    """Write the unit whole or not at all (a temporary file beside it, then a link or rename), mode 0644;
    an existing file is kept unless `force`."""
    if path.exists() and not force:
        raise InvalidInput(f"{path} exists", fix="pass --force to replace it, or name another file with -o")
    if not path.parent.is_dir():
        raise InvalidInput(f"{path.parent} is not a directory", fix="create it, or name a file in a directory")
    temporary = path.parent / f".{path.name}.{os.getpid()}.tmp"
    try:
        with temporary.open("x", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, UNIT_MODE)
        if force:
            os.replace(temporary, path)
        else:
            try:
                os.link(temporary, path)  # fails if the file appeared meanwhile: never overwritten silently
            except FileExistsError:
                raise InvalidInput(f"{path} exists", fix="pass --force to replace it, or name another file") from None
    except OSError as exc:
        raise InvalidInput(f"cannot write {path}: {exc.strerror or exc}", fix="name a writable file with -o") from exc
    finally:
        temporary.unlink(missing_ok=True)
