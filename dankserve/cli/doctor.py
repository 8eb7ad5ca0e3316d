"""`dankserve doctor`: what a GPU host needs, checked one by one, each failure with its fix."""

from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import click

from dankserve import doctor
from dankserve.cli.context import cli_context
from dankserve.cli.options import hardware_option
from dankserve.cli.render import print_json
from dankserve.errors import DankserveError
from dankserve.exitcodes import ExitCode
from dankserve.settings import Settings, keyless_gateway_exposure
from dankserve.snapshot.criu import criu_path

if TYPE_CHECKING:
    from dankserve.host.model import Host
    from dankserve.runtime.podman import PodmanRuntime
    from dankserve.settings import DeploymentSettings, Settings


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
@click.option(
    "--allow-untrusted-code",
    is_flag=True,
    help="Warn instead of failing when a user other than root could change the code the root units run.",
)
@hardware_option
def command(as_json: bool, allow_untrusted_code: bool, hardware: Path | None) -> ExitCode:
    """Check the Podman socket, NVIDIA driver, CDI spec, device nodes, free disk, images and snapshots (CRIU),
    and that only root can change the code dankserve's root units run (the installed unit's, else this
    installation's).

    With --hardware (or DANKSERVE_HARDWARE) the GPUs are a recorded host's: the file is read instead of
    the driver, and the device nodes and CDI spec of this machine are not checked."""
    settings = cli_context().load_settings()
    checks: list[doctor.Check] = [_code_check(allow_untrusted_code)]
    host: Host | None
    if hardware is not None:
        check, host = _recorded_host_check(hardware)
        checks.append(check)
    else:
        gpu_checks, host = _gpu_checks(settings.cache_dir, settings.hf_cache_dir)
        checks += gpu_checks
    for path in (settings.cache_dir, settings.hf_cache_dir):
        checks.append(doctor.disk_verdict(path, doctor.free_disk(path), None, doctor.existing_dir(path)))

    podman_deployments = {n: d for n, d in settings.deployments.items() if d.runtime == "podman" and d.enabled}
    # With no deployment yet (a fresh host) Podman is checked too: the example config uses it.
    wants_podman = bool(podman_deployments) or not settings.deployments
    local = settings.podman_url.startswith("unix://")
    systemd = doctor.runs_systemd()
    missing_podman = (
        doctor.podman_tool_verdict(shutil.which("podman"), settings.podman_url, systemd)
        if wants_podman and local
        else None
    )
    if missing_podman is not None:
        checks.append(missing_podman)
    elif wants_podman:
        try:
            from dankserve.runtime.podman import PodmanRuntime

            runtime = PodmanRuntime(settings.podman_url, cache_dir=settings.state_dir)
            runtime.list_workloads()
            checks.append(doctor.Check("podman", "ok", f"reachable at {settings.podman_url}"))
            if local:
                iptables = shutil.which("iptables", path=doctor.DEFAULT_PATH)
                network = doctor.cni_iptables_verdict(runtime.network_backend(), iptables)
                if network is not None:
                    checks.append(network)
            checks += _podman_snapshots_check(runtime, podman_deployments)
            for name, dep in sorted(podman_deployments.items()):
                present = runtime.image_present(dep.image)
                verdict: doctor.Verdict = "ok" if present else ("fail" if dep.pull == "never" else "warn")
                detail = f"{dep.image} {'present' if present else 'not present'}"
                fix = None if present else f"podman pull {dep.image}"
                checks.append(doctor.Check(f"image for {name}", verdict, detail, fix))
        except DankserveError as exc:
            fix = exc.fix if systemd or not local else doctor.podman_service_fix(settings.podman_url, systemd)
            checks.append(doctor.Check("podman", "fail", exc.message, fix))
    if host is not None:
        checks += [
            _devices_check(n, d, host, recorded=hardware is not None) for n, d in sorted(podman_deployments.items())
        ]

    checks.append(_snapshots_check(settings, recorded=hardware is not None))
    checks += _kernel_checks(settings) + _gateway_key_checks(settings)

    failed = [c for c in checks if c.verdict == "fail"]
    if as_json:
        print_json({"checks": [asdict(c) for c in checks], "ok": not failed})
    else:
        for check in checks:
            click.echo(f"[{check.verdict:4}] {check.name}: {check.detail}")
            if check.fix and check.verdict != "ok":
                click.echo(f"        fix: {check.fix}")
    return ExitCode.ENVIRONMENT if failed else ExitCode.OK


def _gateway_key_checks(settings: Settings) -> list[doctor.Check]:
    """A warning per deployment that a keyless gateway exposes beyond loopback."""
    checks = []
    for name in settings.deployments:
        exposure = keyless_gateway_exposure(settings, name)
        if exposure is not None:
            fix = "write a key into a file (mode 0600), set [gateway] api_key_file to it; clients send it as a Bearer"
            checks.append(doctor.Check(f"gateway key for {name}", "warn", exposure, fix))
    return checks


def _podman_snapshots_check(runtime: PodmanRuntime, deployments: dict[str, DeploymentSettings]) -> list[doctor.Check]:
    """Whether Podman's checkpoints can work, for the Podman deployments with `snapshot = "auto"`."""
    from dankserve.runtime.podman.checkpoint import criu_of
    from dankserve.supervisor.worker.podman_snapshots import unsupported

    wanted = {n: d for n, d in deployments.items() if d.enabled and d.snapshot == "auto"}
    if not wanted:
        return []
    blocked = {n: why for n, d in wanted.items() if (why := unsupported(runtime, d)) is not None}
    return [doctor.podman_snapshot_verdict(criu_of(runtime.info()), criu_path(), blocked)]


def _snapshots_check(settings: Settings, *, recorded: bool) -> doctor.Check:
    """Whether snapshots can work here, for the deployments that want them (`snapshot = "auto"`). A recorded
    host's GPU checkpoint is the stand-in's; a real one's needs cuda-bindings (found, not imported)."""
    from dankserve.snapshot.gpu_helper import gpu_checkpoint_for, unavailable

    enabled = {n: d for n, d in settings.deployments.items() if d.enabled}
    wanted = not enabled or any(d.snapshot == "auto" for d in enabled.values())
    multi_gpu = [n for n, d in enabled.items() if d.snapshot == "auto" and (d.tensor_parallel_size or 1) > 1]
    missing = unavailable(gpu_checkpoint_for(None)) if not recorded else None
    gpu_missing = (missing.reason, missing.fix or "") if missing is not None else None
    reading = doctor.read_criu(criu_path())
    return doctor.snapshot_verdict(reading, wanted=wanted, multi_gpu=multi_gpu, gpu_missing=gpu_missing)


def _kernel_checks(settings: Settings) -> list[doctor.Check]:
    """Kernels each container deployment's vLLM (0.32+, `vllm download-kernels`) would fetch at its next start."""
    from dankserve.plan.catalogue import capabilities, version_from_image
    from dankserve.plan.releases import KERNELS_DIR, KERNELS_SUBCOMMAND
    from dankserve.planning import compile_cache_dir

    checks = []
    for name, dep in sorted(settings.deployments.items()):
        if not dep.enabled or dep.runtime != "podman" or dep.uses_launcher:
            continue
        caps = capabilities(version_from_image(dep.image) or settings.vllm_version)
        if KERNELS_SUBCOMMAND in caps.subcommands:
            kept = compile_cache_dir(settings, name) / KERNELS_DIR / caps.version
            checks.append(doctor.kernels_verdict(name, caps.version, kept, doctor.read_kernel_packages(kept)))
    return checks


def _recorded_host_check(path: Path) -> tuple[doctor.Check, Host | None]:
    from dankserve.host.recorded import read_host

    try:
        host = read_host(path)
    except DankserveError as exc:
        return doctor.Check("recorded host", "fail", exc.message, exc.fix), None
    check = doctor.Check(
        "recorded host",
        "ok",
        f"{path}: driver {host.driver_version}, {len(host.gpus)} GPU(s), recorded (the driver of this machine "
        "is not checked; a Podman deployment's GPU devices are, below)",
    )
    return check, host


def _gpu_checks(*cache_dirs: Path) -> tuple[list[doctor.Check], Host | None]:
    """The driver (through NVML), the device nodes and the CDI spec of this machine; the host NVML read."""
    driver: str | None = None
    checks: list[doctor.Check] = []
    host: Host | None = None
    try:
        from dankserve.host.probe import probe_host

        host = probe_host(list(cache_dirs))
        driver = host.driver_version
        checks.append(doctor.Check("nvidia driver", "ok", f"driver {driver}, {len(host.gpus)} GPU(s)"))
    except DankserveError as exc:
        checks.append(doctor.Check("nvidia driver", "fail", exc.message, exc.fix))
    checks.append(doctor.device_node_verdict(doctor.read_device_nodes()))
    checks.append(doctor.cdi_verdict(doctor.read_cdi_specs(), driver))
    return checks, host


def _devices_check(name: str, dep: DeploymentSettings, host: Host, *, recorded: bool) -> doctor.Check:
    """Whether the runtime would find a CDI entry or a device node on this machine for each of the
    deployment's GPUs (its container cannot be created otherwise)."""
    from dankserve.plan.checks import resolve_gpus
    from dankserve.runtime.base import GpuRef
    from dankserve.runtime.podman.cdi import (
        DEFAULT_CDI_DIRS,
        choose_gpu_passthrough,
        present_device_nodes,
        read_cdi_device_names,
    )

    try:
        gpus = tuple(GpuRef(g.index, g.uuid) for g in resolve_gpus(host, dep.gpus, name))
        dev = Path("/dev")
        chosen = choose_gpu_passthrough(gpus, read_cdi_device_names(DEFAULT_CDI_DIRS), present_device_nodes(dev), dev)
    except DankserveError as exc:
        return doctor.gpu_devices_verdict(name, None, exc.message, recorded)
    return doctor.gpu_devices_verdict(name, chosen.mode, None, recorded)


def _code_check(allow: bool) -> doctor.Check:
    """Whether only root can change the code root runs: the installed unit's ExecStart, else (as root) this
    installation's dankserve, which `dankserve up` runs in the background and `install` would name."""
    import os

    from dankserve.cli.install import dankserve_executable, installed_executable, unit_code_problems
    from dankserve.code_trust import ROOT_INSTALL_FIX, describe

    name = "code the unit runs"
    executable = installed_executable()
    unit = executable is not None
    if executable is None:
        if os.geteuid() != 0:
            return doctor.Check(name, "ok", "no unit installed, and dankserve runs as you (not root)")
        executable = Path(dankserve_executable())
    problems = unit_code_problems(executable, unit=unit)
    if not problems:
        return doctor.Check(name, "ok", f"{executable}, its interpreter and imports are root's alone")
    detail = f"someone other than root could change what {executable} runs as root:\n{describe(problems)}"
    return doctor.Check(name, "warn" if allow else "fail", detail, ROOT_INSTALL_FIX)
