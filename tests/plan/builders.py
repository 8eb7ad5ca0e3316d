"""Builders for the planner's tests: hosts, GPUs, capabilities and model facts."""

from __future__ import annotations

from dankserve.host.model import Cpu, Gpu, Host, Memory, NumaNode
from dankserve.host.recorded import read_host
from dankserve.plan.catalogue import VllmCapabilities, capabilities
from dankserve.plan.models import ModelFacts
from dankserve.testing import HOSTS_DIR

HOSTS = HOSTS_DIR
GIB = 1 << 30
MIB = 1 << 20
PLAN_JSON_KEYS = [
    "deployment",
    "image",
    "argv",
    "env",
    "flags",
    "gpus",
    "capacity",
    "host_ram_bytes",
    "notes",
    "warnings",
    "exposure",
]
"""The keys of a plan's JSON (`plan --json`, Plan.to_json), in order."""

QWEN3_30B = ModelFacts(
    model="Qwen/Qwen3-30B-A3B",
    parameter_bytes=61_100_000_000,
    num_attention_heads=32,
    num_key_value_heads=4,
    num_hidden_layers=48,
    head_dim=128,
    max_position_embeddings=40960,
    moe=True,
    dtype_bytes=2,
    source="test",
)
LLAMA_70B = ModelFacts(
    model="meta-llama/Llama-3.1-70B-Instruct",
    parameter_bytes=141_107_412_992,
    num_attention_heads=64,
    num_key_value_heads=8,
    num_hidden_layers=80,
    head_dim=128,
    max_position_embeddings=131072,
    moe=False,
    dtype_bytes=2,
    source="test",
)


def recorded(name: str) -> Host:
    """A recorded host from dankserve/testing/hosts/NAME.json."""
    return read_host(HOSTS / f"{name}.json")


def gpu(
    index: int = 0,
    *,
    memory_gib: float = 80,
    cc: tuple[int, int] = (9, 0),
    numa: int | None = 0,
    name: str = "NVIDIA H100 80GB HBM3",
    mig: bool = False,
) -> Gpu:
    """A GPU of the given size and architecture."""
    return Gpu(
        index=index,
        uuid=f"GPU-test-{index}",
        name=name,
        memory_total_bytes=int(memory_gib * GIB),
        memory_free_bytes=int(memory_gib * GIB) - 512 * MIB,
        compute_capability=cc,
        numa_node=numa,
        mig_mode=mig,
    )


def host(
    *,
    gpus: tuple[Gpu, ...] | None = None,
    cores: int = 32,
    ram_gib: float = 256,
    available_gib: float | None = None,
    numa_nodes: int = 1,
) -> Host:
    """A host with these GPUs (default one H100), cores, RAM and NUMA nodes."""
    return Host(
        gpus=gpus if gpus is not None else (gpu(),),
        cpu=Cpu(physical_cores=cores, logical_cores=cores * 2),
        memory=Memory(
            total_bytes=int(ram_gib * GIB),
            available_bytes=int((available_gib if available_gib is not None else ram_gib * 0.9) * GIB),
        ),
        numa_nodes=tuple(NumaNode(id=i, cpus=(i,)) for i in range(numa_nodes)),
    )


def caps(version: str = "0.33.0") -> VllmCapabilities:
    """The catalogued capabilities of a vLLM release."""
    return capabilities(version)
