"""From a plan to the runtime's workload spec: mounts, secrets, labels. Pure."""

from __future__ import annotations

from pathlib import Path

import dankserve.launcher
from dankserve.plan.types import Plan
from dankserve.planning import CONTAINER_HF_HOME, backend_socket, compile_cache_dir
from dankserve.runtime.base import (
    LABEL_BOOT,
    LABEL_FINGERPRINT,
    GpuRef,
    KernelsDir,
    LauncherSpec,
    Mount,
    WorkloadSpec,
)
from dankserve.settings import DeploymentSettings, Settings, is_loopback
from dankserve.supervisor.worker.deployment_secrets import secret_files
from dankserve.supervisor.worker.podman_snapshots import criu_config_path, secrets_dir


def workload_spec(plan: Plan, dep: DeploymentSettings, settings: Settings, boot: int) -> WorkloadSpec:
    """The spec a runtime needs to start `plan` as boot number `boot`."""
    secrets = secret_files(dep)
    cache = compile_cache_dir(settings, plan.deployment)
    snapshots = dep.snapshot == "auto" and dep.runtime == "podman"
    return WorkloadSpec(
        deployment=plan.deployment,
        image=plan.image,
        argv=plan.argv,
        env=dict(plan.env),
        port=dep.port,
        bind_host=dep.host,
        # Loopback stays loopback: no published port, so no routable bridge address (docs/OPERATIONS.md).
        host_network=is_loopback(dep.host),
        pull=dep.pull,
        gpus=tuple(GpuRef(i, u) for i, u in zip(plan.gpu_indices, plan.gpu_uuids, strict=True)),
        # The compile cache is mounted by the runtime from `cache_dir` (at VLLM_CACHE_ROOT).
        mounts=(
            Mount(settings.hf_cache_dir, CONTAINER_HF_HOME),
            *(Mount(Path(host), target, read_only=True) for host, target in plan.lora_mounts),
        ),
        secrets=secrets,
        labels={LABEL_BOOT: str(boot), LABEL_FINGERPRINT: plan.fingerprint},
        shm_size=plan.shm_size,
        numa_bind=plan.numa_bind,
        privileged=dep.privileged,
        executable=dep.executable,
        cache_dir=cache,
        launcher=LauncherSpec(LAUNCHER_SOURCE, launcher_run_dir(settings, plan.deployment))
        if dep.uses_launcher
        else None,
        socket=backend_socket(settings, plan.deployment, dep),
        kernels=KernelsDir(plan.kernels.target, plan.kernels.download) if plan.kernels is not None else None,
        criu_config=criu_config_path(settings.state_dir) if snapshots else None,
        secrets_dir=secrets_dir(settings.state_dir, plan.deployment) if snapshots and secrets else None,
    )


LAUNCHER_SOURCE = Path(dankserve.launcher.__file__).resolve().parent
"""The launcher package (standard library only) as installed with dankserve: mounted into containers."""


def launcher_run_dir(settings: Settings, deployment: str) -> Path:
    """The launcher's run directory (its control socket) for `deployment`, under the state dir."""
    return settings.state_dir / "launchers" / deployment
