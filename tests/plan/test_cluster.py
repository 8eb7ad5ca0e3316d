"""Tests for dankserve.plan.cluster: TP x PP over a group of hosts, and the refusals with reasons."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dankserve.errors import DankserveError, InfeasiblePlan
from dankserve.plan.catalogue import load_catalogue
from dankserve.plan.cluster import LEADER, GroupMember, plan_group, stage_facts
from dankserve.plan.models import ModelFacts
from dankserve.settings import DeploymentSettings
from tests.plan.builders import LLAMA_70B, QWEN3_30B, caps, gpu, host

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


def node(count: int, *, name: str = H100, memory_gib: float = 80, cores: int = 32) -> object:
    return host(gpus=tuple(gpu(i, name=name, memory_gib=memory_gib) for i in range(count)), cores=cores)


def members(*hosts: object) -> list[GroupMember]:
    addresses = [LEADER, *(f"10.9.0.{i + 2}:7390" for i in range(len(hosts) - 1))]
    return [GroupMember(a, h) for a, h in zip(addresses, hosts, strict=True)]  # type: ignore[arg-type]


def dep(**changes: object) -> DeploymentSettings:
    base: dict[str, object] = {"model": LLAMA_70B.model, "hosts": ["10.9.0.2:7390"], "kv_offload": "off"}
    base.update(changes)
    return DeploymentSettings.model_validate(base)


def flag(argv: tuple[str, ...], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


# (hosts, GPUs per host, model, expected TP, expected PP)
SHAPES = [
    (2, 1, LLAMA_70B, "1", "2"),
    (2, 4, LLAMA_70B, "4", "2"),
    (3, 2, LLAMA_70B, "2", "3"),
    (2, 8, QWEN3_30B, "8", "2"),
]


@pytest.mark.parametrize(("hosts", "gpus", "model", "tp", "pp"), SHAPES)
def test_group_shape_flags(hosts: int, gpus: int, model: ModelFacts, tp: str, pp: str) -> None:
    """TP is the GPUs per host, PP the number of hosts, and the Ray executor is chosen."""
    plan = plan_group(
        "big", dep(model=model.model), members(*[node(gpus) for _ in range(hosts)]), caps(), model, catalogue=None
    )
    assert flag(plan.argv, "--tensor-parallel-size") == tp
    assert flag(plan.argv, "--pipeline-parallel-size") == pp
    assert flag(plan.argv, "--distributed-executor-backend") == "ray"
    assert plan.group is not None and plan.group.pipeline_parallel_size == int(pp)


def test_extra_args_stay_last() -> None:
    """The group's flags go before extra_args, which stay verbatim at the end."""
    plan = plan_group("big", dep(extra_args=["--seed", "7"]), members(node(2), node(2)), caps(), LLAMA_70B)
    assert plan.argv[-2:] == ("--seed", "7")
    assert plan.argv.index("--pipeline-parallel-size") < plan.argv.index("--seed")


def test_weights_that_need_two_hosts_fit_across_them() -> None:
    """A 70B model too big for one 80 GiB GPU plans on two such hosts: each stage holds half the weights."""
    one = node(1)
    with pytest.raises(InfeasiblePlan):
        plan_group("big", dep(hosts=[]), [GroupMember(LEADER, one)], caps(), LLAMA_70B)  # type: ignore[arg-type]
    plan = plan_group("big", dep(), members(node(1), node(1)), caps(), LLAMA_70B)
    assert flag(plan.argv, "--pipeline-parallel-size") == "2"


# (hosts, model changes, expected words in the message, exit code)
REFUSALS = [
    ((node(2), node(4)), {}, ("unequal GPUs", "2 x", "4 x", "10.9.0.2:7390"), 4),
    ((node(2), node(2, name=A100)), {}, ("unequal GPUs", A100), 4),
    ((node(2), node(2, memory_gib=40)), {}, ("unequal GPUs", "40960 MiB"), 4),
    ((node(3), node(3)), {}, ("does not divide", "64 attention heads"), 4),
    ((node(2), node(2), node(2)), {"num_hidden_layers": 2}, ("3 pipeline stages", "only 2 layers"), 4),
    ((node(4), node(4, cores=4)), {}, ("host 10.9.0.2:7390", "physical CPU cores"), 4),
]


@pytest.mark.parametrize(("hosts", "model_changes", "words", "code"), REFUSALS)
def test_refusals_name_the_reason(
    hosts: tuple[object, ...], model_changes: dict[str, int], words: tuple[str, ...], code: int
) -> None:
    """Unequal hosts, TP not dividing the heads, more hosts than layers, a host failing its checks: refused."""
    model = replace(LLAMA_70B, **model_changes)  # type: ignore[arg-type]
    with pytest.raises(DankserveError) as caught:
        plan_group("big", dep(), members(*hosts), caps(), model)
    assert caught.value.exit_code == code
    for word in words:
        assert word in caught.value.message


def test_tensor_parallel_setting_must_match_the_hosts() -> None:
    """A tensor_parallel_size other than the GPUs per host is refused with the value that would work."""
    with pytest.raises(InfeasiblePlan, match="tensor_parallel_size = 2") as caught:
        plan_group("big", dep(tensor_parallel_size=2), members(node(4), node(4)), caps(), LLAMA_70B)
    assert "4" in (caught.value.fix or "")


def test_release_without_the_flags_is_refused() -> None:
    """A vLLM release the catalogue shows without the group's flags is refused (exit 4)."""
    catalogue = load_catalogue()
    plain = caps()
    lacking = replace(plain, flags={f: s for f, s in plain.flags.items() if f != "--distributed-executor-backend"})
    with pytest.raises(InfeasiblePlan, match="--distributed-executor-backend"):
        plan_group("big", dep(), members(node(2), node(2)), lacking, LLAMA_70B, catalogue=catalogue)


def test_catalogue_has_the_group_flags_for_0_33() -> None:
    """The target release catalogues every flag a group plan adds."""
    for name in ("--tensor-parallel-size", "--pipeline-parallel-size", "--distributed-executor-backend"):
        assert caps("0.33.0").has(name)


def test_stage_facts_share_weights_and_layers() -> None:
    """One stage of PP stages holds its share of weights and layers, rounded up; PP 1 is the model itself."""
    assert stage_facts(LLAMA_70B, 1) is LLAMA_70B
    stage = stage_facts(LLAMA_70B, 3)
    assert stage.num_hidden_layers == 27
    assert stage.parameter_bytes is not None and stage.parameter_bytes * 3 >= LLAMA_70B.parameter_bytes  # type: ignore[operator]


def test_fingerprint_changes_with_the_members() -> None:
    """Adding a host changes the plan's fingerprint; the same group gives the same one."""
    two = plan_group("big", dep(), members(node(2), node(2)), caps(), LLAMA_70B)
    again = plan_group("big", dep(), members(node(2), node(2)), caps(), LLAMA_70B)
    three = plan_group("big", dep(), members(node(2), node(2), node(2)), caps(), LLAMA_70B)
    assert two.fingerprint == again.fingerprint != three.fingerprint
