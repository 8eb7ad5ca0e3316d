"""The planner's output: the vLLM command line, its environment, and a reason for each flag."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dankserve.plan.releases import KernelDownload

from dankserve.plan.exposure import Exposure


@dataclass(frozen=True)
class FlagChoice:
    """One vLLM flag the planner chose, with its value (None for a bare switch) and why."""

    flag: str
    value: str | tuple[str, ...] | None
    reason: str

    def tokens(self) -> list[str]:
        """The flag as separate argv tokens: switches bare, lists as separate tokens."""
        if self.value is None:
            return [self.flag]
        if isinstance(self.value, tuple):
            return [self.flag, *self.value]
        return [self.flag, self.value]

    def to_json(self) -> dict[str, Any]:
        value: Any = list(self.value) if isinstance(self.value, tuple) else self.value
        return {"flag": self.flag, "value": value, "reason": self.reason}


@dataclass(frozen=True)
class Capacity:
    """What the plan promises in the user's terms: context length and concurrent full-length requests."""

    context_tokens: int | None
    """The context length each request may use (vLLM's, after an `auto` shrink), None when unknown."""
    context_note: str
    kv_cache_tokens: int | None
    """Tokens the KV cache holds on each GPU (all requests together), None when unknown."""
    concurrency: float | None
    """Full-length requests the KV cache holds at once (vLLM's "maximum concurrency"), None when unknown."""
    max_num_seqs: int | None

    def describe(self) -> str:
        """'context 8,192 tokens; the KV cache holds 36,864 tokens: 4.5 requests of full length at once'."""
        if self.context_tokens is None:
            return f"context: {self.context_note}"
        text = f"context {self.context_tokens:,} tokens ({self.context_note})"
        if self.kv_cache_tokens is not None and self.concurrency is not None:
            text += (
                f"; the KV cache holds about {self.kv_cache_tokens:,} tokens: {self.concurrency:.1f} requests of "
                "full length at once"
            )
            if self.max_num_seqs is not None and self.concurrency < self.max_num_seqs:
                text += f" (up to {self.max_num_seqs} shorter ones, --max-num-seqs)"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "context_tokens": self.context_tokens,
            "context_note": self.context_note,
            "kv_cache_tokens": self.kv_cache_tokens,
            "concurrency": None if self.concurrency is None else round(self.concurrency, 2),
            "max_num_seqs": self.max_num_seqs,
        }


@dataclass(frozen=True)
class GroupPlan:
    """How a multi-host group splits the model: its followers and the parallel sizes."""

    followers: tuple[str, ...]
    tensor_parallel_size: int
    pipeline_parallel_size: int


@dataclass(frozen=True)
class Plan:
    """How to run one deployment: everything the runtime needs, nothing it must work out."""

    deployment: str
    image: str
    model: str
    vllm_version: str
    argv: tuple[str, ...]
    """What follows the image entrypoint (`vllm serve`): the model, then the flags."""
    env: Mapping[str, str]
    flags: tuple[FlagChoice, ...]
    warnings: tuple[str, ...]
    gpu_indices: tuple[int, ...]
    """NVML indices of the GPUs assigned to this deployment (PCI bus order)."""
    gpu_uuids: tuple[str, ...]
    tensor_parallel_size: int
    numa_bind: bool
    """The plan binds workers to NUMA nodes (the container then needs SYS_NICE and numactl)."""
    fingerprint: str
    """Hash of config and totals (never of live free memory): equal plans, equal fingerprints."""
    gpu_memory_utilization: float
    """The fraction of each assigned GPU this deployment may use (`--gpu-memory-utilization`; the GPU-sharing
    check, swap groups' room, the policy's remediation band)."""
    weights_bytes: int | None = None
    """The model's weights on disk (None: unknown), what a level-1 sleep keeps in host RAM."""
    sleep_mode: bool = False
    """The argv enables vLLM's sleep mode (`--enable-sleep-mode`: a swap group member whose release has it)."""
    group: GroupPlan | None = None
    """A multi-host group's shape (None: one host)."""
    max_model_len: str | None = None
    """The planned `--max-model-len` value (None: the model's own length)."""
    kv_cache_dtype: str | None = None
    """The planned `--kv-cache-dtype`."""
    capacity: Capacity | None = None
    host_ram_bytes: int = 0
    """Host RAM the server takes beyond its own process: CPU KV offload, offloaded weights, LoRA adapters."""
    lora_mounts: tuple[tuple[str, str], ...] = ()
    """Local LoRA adapter directories and where a container sees them (read-only mounts)."""
    exposure: Exposure | None = None
    """Where the server listens, who can connect and which routes answer them without the key (issue 38)."""
    notes: tuple[str, ...] = ()
    """Decisions that set no flag (vLLM sizing the KV cache itself on a first boot, the kernels step)."""
    kernels: KernelDownload | None = None
    """The kept kernels (`vllm download-kernels` into the kept cache dir before a first boot; None: the release
    has no such subcommand, or the server is no container of its own)."""
    shm_size: str | None = None
    """A Podman container's private /dev/shm size (None: the host's, ipc=host; plan/shm.py decides)."""

    def to_json(self) -> dict[str, Any]:
        """The `dankserve plan --json` form."""
        return {
            "deployment": self.deployment,
            "image": self.image,
            "argv": list(self.argv),
            "env": dict(self.env),
            "flags": [f.to_json() for f in self.flags],
            "gpus": list(self.gpu_indices),
            "capacity": self.capacity.to_json() if self.capacity is not None else None,
            "host_ram_bytes": self.host_ram_bytes,
            "notes": list(self.notes),
            "warnings": list(self.warnings),
            "exposure": self.exposure.to_json() if self.exposure is not None else None,
        }
