"""From a plan to the runtime's workload spec: mounts, secrets, labels. Pure."""

from __future__ import annotations

from pathlib import Path

from dankserve.plan.types import Plan
from dankserve.runtime.base import LABEL_BOOT, LABEL_FINGERPRINT, GpuRef, Mount, SecretFile, WorkloadSpec
from dankserve.settings import DeploymentSettings, Settings

HF_CACHE_TARGET = "/root/.cache/huggingface"
VLLM_CACHE_TARGET = "/root/.cache/vllm"


def compile_cache_dir(settings: Settings, deployment: str) -> Path:
    """The host directory holding this deployment's torch.compile cache (VLLM_CACHE_ROOT)."""
    return settings.cache_dir / "deployments" / deployment / "vllm"


def vllm_cache_root(settings: Settings, deployment: str, dep: DeploymentSettings) -> str:
    """VLLM_CACHE_ROOT as vLLM sees it: the container path, or the host dir for a process."""
    if dep.runtime == "process":
        return str(compile_cache_dir(settings, deployment))
    return VLLM_CACHE_TARGET


def workload_spec(plan: Plan, dep: DeploymentSettings, settings: Settings, boot: int) -> WorkloadSpec:
    """The spec a runtime needs to start `plan` as boot number `boot`."""
    secrets: list[SecretFile] = []
    if dep.hf_token_file is not None:
        secrets.append(SecretFile("hf_token", dep.hf_token_file, "HF_TOKEN_PATH"))
    if dep.api_key_file is not None:
        secrets.append(SecretFile("api_key", dep.api_key_file, "VLLM_API_KEY"))
    cache = compile_cache_dir(settings, plan.deployment)
    return WorkloadSpec(
        deployment=plan.deployment,
        image=plan.image,
        argv=plan.argv,
        env=dict(plan.env),
        port=dep.port,
        bind_host=dep.host,
        pull=dep.pull,
        gpus=tuple(GpuRef(i, u) for i, u in zip(plan.gpu_indices, plan.gpu_uuids, strict=True)),
        mounts=(
            Mount(settings.hf_cache_dir, HF_CACHE_TARGET),
            Mount(cache, VLLM_CACHE_TARGET),
        ),
        secrets=tuple(secrets),
        labels={LABEL_BOOT: str(boot), LABEL_FINGERPRINT: plan.fingerprint},
        shm_size=dep.shm_size,
        numa_bind=plan.numa_bind,
        privileged=dep.privileged,
        executable=dep.executable,
        cache_dir=cache,
    )
