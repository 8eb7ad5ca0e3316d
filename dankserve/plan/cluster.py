"""Planning one deployment across several hosts (a group): tensor parallel inside each host,
pipeline parallel across hosts, on Ray.

Pure: every member's recorded or probed hardware comes in as data. TP = the GPUs each host gives
the deployment, PP = the number of hosts. The hosts must be equal (vLLM's Ray executor places
the same TP ranks on every node); TP must divide the attention heads and PP may not exceed the
layers. Every host passes the usual single-host checks for its pipeline stage (its share of the
weights and layers), each failure naming the host. The leader's plan gains
`--pipeline-parallel-size` and `--distributed-executor-backend ray`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from dankserve.errors import DankserveError, InfeasiblePlan
from dankserve.host.model import Gpu, Host
from dankserve.plan import checks
from dankserve.plan.catalogue import DEFAULT_CONTAINER_CACHE_ROOT, Catalogue, VllmCapabilities
from dankserve.plan.models import ModelFacts
from dankserve.plan.plan import plan_deployment
from dankserve.plan.types import FlagChoice, GroupPlan, Plan
from dankserve.settings import DeploymentSettings

GROUP_FLAGS = ("--tensor-parallel-size", "--pipeline-parallel-size", "--distributed-executor-backend")
LEADER = "leader"


@dataclass(frozen=True)
class GroupMember:
    """One host of a group: where its daemon is (LEADER for this one) and its hardware."""

    address: str
    host: Host


@dataclass(frozen=True)
class GroupShape:
    """How a group splits the model: TP ranks per host times PP stages (one per host)."""

    tensor_parallel_size: int
    pipeline_parallel_size: int
    gpus_per_host: tuple[Gpu, ...]
    """The leader's assigned GPUs (every member's are alike)."""

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


def _gpu_kind(gpus: Sequence[Gpu]) -> str:
    if not gpus:
        return "no GPU"
    names = sorted({f"{g.name} ({g.memory_total_bytes // (1 << 20)} MiB)" for g in gpus})
    return f"{len(gpus)} x " + " + ".join(names)


def group_shape(name: str, dep: DeploymentSettings, members: Sequence[GroupMember]) -> GroupShape:
    """TP and PP of the group; unequal hosts or a conflicting tensor_parallel_size: exit 4."""
    assigned = [checks.resolve_gpus(m.host, dep.gpus, name) for m in members]
    kinds = [_gpu_kind(gpus) for gpus in assigned]
    if len(set(kinds)) > 1:
        listing = "; ".join(f"{m.address}: {kind}" for m, kind in zip(members, kinds, strict=True))
        raise InfeasiblePlan(
            f"deployment {name!r} spans hosts with unequal GPUs ({listing}): vLLM's Ray executor runs the same "
            "tensor-parallel ranks on every host, so each must give the deployment the same number and kind of GPUs",
            fix="use hosts with equal GPUs, or set gpus so each host assigns the same number of the same GPU",
        )
    checks.check_has_gpus(assigned[0], name)
    tp = len(assigned[0])
    if dep.tensor_parallel_size is not None and dep.tensor_parallel_size != tp:
        raise InfeasiblePlan(
            f"deployment {name!r}: tensor_parallel_size = {dep.tensor_parallel_size}, but a multi-host group uses "
            f"every assigned GPU of each host ({tp})",
            fix=f"leave tensor_parallel_size unset (or set it to {tp}), or set gpus to the GPUs each host should use",
        )
    return GroupShape(tp, len(members), assigned[0])


def check_pipeline(pipeline_parallel_size: int, model: ModelFacts) -> None:
    """More pipeline stages (hosts) than the model has layers: exit 4."""
    layers = model.num_hidden_layers
    if layers is not None and pipeline_parallel_size > layers:
        raise InfeasiblePlan(
            f"{pipeline_parallel_size} hosts means {pipeline_parallel_size} pipeline stages, but {model.model} has "
            f"only {layers} layers: each stage needs at least one",
            fix=f"use at most {layers} hosts",
        )


def stage_facts(model: ModelFacts, pipeline_parallel_size: int) -> ModelFacts:
    """The model as one pipeline stage sees it: its share of the weights and layers (rounded up)."""
    if pipeline_parallel_size == 1:
        return model

    def share(value: int | None) -> int | None:
        return None if value is None else math.ceil(value / pipeline_parallel_size)

    return replace(
        model,
        parameter_bytes=share(model.parameter_bytes),
        num_hidden_layers=share(model.num_hidden_layers),
    )


def _on_host(address: str, exc: DankserveError) -> DankserveError:
    """The same error, naming the host it concerns."""
    return type(exc)(f"host {address}: {exc.message}", fix=exc.fix)


def plan_group(
    name: str,
    dep: DeploymentSettings,
    members: Sequence[GroupMember],
    caps: VllmCapabilities,
    model: ModelFacts,
    *,
    learned_kv_cache_memory_bytes: int | None = None,
    vllm_cache_root: str = DEFAULT_CONTAINER_CACHE_ROOT,
    catalogue: Catalogue | None = None,
    socket: str | None = None,
) -> Plan:
    """The leader's plan for a group (members[0] is the leader); exit 2/4 errors name the host. `socket`: where
    the leader's API server listens (None: TCP)."""
    if not members or members[0].address != LEADER:
        raise ValueError("members must start with the leader")
    shape = group_shape(name, dep, members)
    checks.check_tensor_parallel(shape.tensor_parallel_size, shape.tensor_parallel_size, model)
    check_pipeline(shape.pipeline_parallel_size, model)
    checks.check_flags_supported([(flag, "a multi-host group (hosts)") for flag in GROUP_FLAGS], caps, catalogue)
    stage = stage_facts(model, shape.pipeline_parallel_size)
    per_host = dep.model_copy(update={"tensor_parallel_size": shape.tensor_parallel_size})
    plans: list[Plan] = []
    for member in members:
        try:
            plans.append(
                plan_deployment(
                    name,
                    per_host,
                    member.host,
                    caps,
                    stage,
                    learned_kv_cache_memory_bytes=learned_kv_cache_memory_bytes if member.address == LEADER else None,
                    vllm_cache_root=vllm_cache_root,
                    catalogue=catalogue,
                    socket=socket,
                )
            )
        except DankserveError as exc:
            raise _on_host(member.address, exc) from None
    return with_group_flags(plans[0], shape, [m.address for m in members[1:]], [p.fingerprint for p in plans])


def with_group_flags(
    leader: Plan, shape: GroupShape, followers: Sequence[str], member_fingerprints: Sequence[str]
) -> Plan:
    """The leader's single-host plan turned into the group's: PP and the Ray executor added before extra_args."""
    pp = FlagChoice(
        "--pipeline-parallel-size",
        str(shape.pipeline_parallel_size),
        f"one pipeline stage per host ({shape.pipeline_parallel_size} hosts: this one and {', '.join(followers)})",
    )
    backend = FlagChoice(
        "--distributed-executor-backend",
        "ray",
        "the stages run on other hosts: vLLM places them through Ray (multiprocessing is single-host only)",
    )
    flags = [
        replace(f, reason=f"{f.reason}; in a group, TP = the GPUs of each host") if f.flag == GROUP_FLAGS[0] else f
        for f in leader.flags
    ]
    # argv is [model, *flag tokens, *extra_args]: rebuild it so extra_args stay last.
    extra = leader.argv[1 + sum(len(f.tokens()) for f in leader.flags) :]
    flags += [pp, backend]
    argv = (leader.argv[0], *(t for f in flags for t in f.tokens()), *extra)
    fingerprint = hashlib.sha256(
        json.dumps({"members": list(member_fingerprints), "followers": list(followers)}).encode()
    ).hexdigest()
    return replace(
        leader,
        argv=argv,
        flags=tuple(flags),
        fingerprint=fingerprint,
        group=GroupPlan(tuple(followers), shape.tensor_parallel_size, shape.pipeline_parallel_size),
    )
