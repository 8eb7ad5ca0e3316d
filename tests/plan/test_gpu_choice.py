"""Tests for dankserve.plan.gpu_choice: the best-connected TP subset of the assigned GPUs."""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dankserve.host.model import LINK_KINDS, GpuLink, Host
from dankserve.plan.gpu_choice import choose_gpus, connection_key
from dankserve.plan.plan import plan_deployment
from dankserve.settings import DeploymentSettings
from tests.plan.builders import LLAMA_70B, QWEN3_30B, caps, gpu, host, recorded


def with_links(base: Host, kinds: dict[tuple[int, int], str], default: str = "NV18") -> Host:
    """The host with every pair linked as `kinds` says (NVn for NVLink with n links), else `default`."""
    links = []
    for a, b in combinations(range(len(base.gpus)), 2):
        label = kinds.get((a, b), default)
        nvlinks = int(label[2:]) if label.startswith("NV") else None
        links.append(GpuLink(a=a, b=b, kind="NVLINK" if nvlinks else label, nvlinks=nvlinks))
    return base.model_copy(update={"links": tuple(links)})


def pcie_box() -> Host:
    """Four PCIe GPUs on one NUMA node: 0-1 and 2-3 behind one switch each, NODE between, and an NVLink bridge 1-3."""
    base = host(gpus=tuple(gpu(i) for i in range(4)))
    return with_links(base, {(0, 1): "PXB", (2, 3): "PXB", (1, 3): "NV4"}, default="NODE")


def two_sockets() -> Host:
    """Four GPUs interleaved over two NUMA nodes (0, 1, 0, 1), PCIe only: SYS across the sockets."""
    base = host(gpus=tuple(gpu(i, numa=i % 2) for i in range(4)), numa_nodes=2)
    return with_links(base, {(0, 2): "NODE", (1, 3): "NODE"}, default="SYS")


CASES = [
    # host, assigned GPU indices, TP size, chosen GPU indices
    ("h200x4-vm-real", recorded("h200x4-vm-real"), None, 2, (0, 1)),  # all NV18: the first ones, as before
    ("h200x4-vm-real, all", recorded("h200x4-vm-real"), None, 4, (0, 1, 2, 3)),
    ("h200x2-vm-real", recorded("h200x2-vm-real"), None, 1, (0,)),
    ("a100-40x8 NVSwitch", recorded("a100-40x8-2numa"), None, 4, (0, 1, 2, 3)),  # NV12 everywhere, node 0
    ("h100x8 NV18 2 NUMA, assigned across", recorded("h100x8-2numa"), (2, 3, 4, 5, 6), 2, (2, 3)),
    ("h100x8 NV18 2 NUMA, one node wins", recorded("h100x8-2numa"), (3, 4, 5), 2, (4, 5)),  # not 3-4 across nodes
    ("rtx4090x4 PCIe", recorded("rtx4090x4-1numa"), None, 2, (0, 1)),  # PXB beats NODE
    ("rtx4090x4 PCIe, 1-2-3", recorded("rtx4090x4-1numa"), (1, 2, 3), 2, (2, 3)),
    ("NVLink bridge wins", pcie_box(), None, 2, (1, 3)),
    ("NVLink bridge, TP 3: fewest NODE hops", pcie_box(), None, 3, (0, 1, 3)),
    ("two sockets: one node", two_sockets(), None, 2, (0, 2)),
    ("two sockets: TP 3 has one node pair", two_sockets(), None, 3, (0, 1, 2)),
    ("links unknown, 2 NUMA: one node", recorded("h100x4-2numa"), (1, 2, 3), 2, (2, 3)),
    ("links unknown, 1 NUMA: first ones", recorded("h200x1-vm"), None, 1, (0,)),
]


@pytest.mark.parametrize(
    ("base", "assigned", "tp", "expected"), [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
def test_chosen_gpus(base: Host, assigned: tuple[int, ...] | None, tp: int, expected: tuple[int, ...]) -> None:
    """The TP group is the best-connected subset: NVLink, then fewest SYS/NODE pairs, one NUMA node, lowest indices."""
    gpus = base.gpus if assigned is None else tuple(g for g in base.gpus if g.index in assigned)
    assert tuple(g.index for g in choose_gpus(base, gpus, tp).value) == expected


@pytest.mark.parametrize(
    ("base", "tp", "words"),
    [
        (
            recorded("h200x4-vm-real"),
            2,
            "GPUs 0, 1, every pair on NVLink (NV18) (all equally connected, so the first ones)",
        ),
        (pcie_box(), 2, "GPUs 1, 3, every pair on NVLink (NV4) (the best connected of the 6 choices of 2 of 4)"),
        (two_sockets(), 2, "GPUs 0, 2, links NODE, NUMA node 0 (the best connected of the 6 choices of 2 of 4)"),
        (
            recorded("h100x4-2numa"),
            2,
            "GPUs 0, 1, NUMA node 0 (links between GPUs not recorded, so the GPUs on the fewest",
        ),
        (recorded("h200x4-vm-real"), 4, "all 4 assigned GPUs"),
    ],
)
def test_reason_says_which_and_why(base: Host, tp: int, words: str) -> None:
    """The reason names the GPUs, their links and NUMA nodes, and why this set."""
    assert choose_gpus(base, base.gpus, tp).reason.startswith(words)


def test_plan_uses_the_chosen_gpus_and_says_why_in_the_tp_reason() -> None:
    """A plan needing fewer GPUs than assigned runs on the chosen ones and the TP flag's reason says why."""
    dep = DeploymentSettings(model="q", gpus=[0, 1, 2, 3])
    plan = plan_deployment("d", dep, pcie_box(), caps(), QWEN3_30B)
    assert plan.gpu_indices == (0,)  # one GPU has no links to weigh: the first
    plan = plan_deployment("d", dep, pcie_box(), caps(), LLAMA_70B)
    assert (plan.tensor_parallel_size, plan.gpu_indices) == (2, (1, 3))
    tp_reason = next(f.reason for f in plan.flags if f.flag == "--tensor-parallel-size")
    assert "uses GPUs 1, 3, every pair on NVLink (NV4)" in tp_reason
    assert any("GPUs 1, 3" in w for w in plan.warnings)


@st.composite
def topologies(draw: st.DrawFn) -> tuple[Host, tuple[int, ...], int]:
    """A host of 1-6 GPUs with random links and NUMA nodes (some unknown), assigned GPUs and a TP size."""
    count = draw(st.integers(1, 6))
    numa_nodes = draw(st.integers(1, 2))
    nodes = [draw(st.one_of(st.none(), st.integers(0, numa_nodes - 1))) for _ in range(count)]
    base = host(gpus=tuple(gpu(i, numa=nodes[i]) for i in range(count)), numa_nodes=numa_nodes)
    kinds = {}
    for pair in combinations(range(count), 2):
        kind = draw(st.sampled_from([*LINK_KINDS, None]))
        if kind is not None:
            kinds[pair] = f"NV{draw(st.integers(1, 18))}" if kind == "NVLINK" else kind
    linked = with_links(base, kinds) if draw(st.booleans()) else base
    if kinds and linked.links is not None:  # drop the pairs drawn as unknown
        linked = linked.model_copy(update={"links": tuple(link for link in linked.links if (link.a, link.b) in kinds)})
    assigned = tuple(sorted(draw(st.sets(st.integers(0, count - 1), min_size=1))))
    tp = draw(st.integers(1, len(assigned)))
    return linked, assigned, tp


@settings(max_examples=150, deadline=None)
@given(topologies())
def test_choice_is_a_best_subset_of_the_assigned_of_size_tp(case: tuple[Host, tuple[int, ...], int]) -> None:
    """The chosen set always has TP GPUs, all assigned, in index order, and none better connected exists."""
    base, assigned, tp = case
    gpus = tuple(g for g in base.gpus if g.index in assigned)
    chosen = choose_gpus(base, gpus, tp).value
    indices = [g.index for g in chosen]
    assert len(chosen) == tp
    assert set(indices) <= set(assigned)
    assert indices == sorted(indices)
    best = min(connection_key(base, subset) for subset in combinations(gpus, tp))
    assert connection_key(base, chosen) == best
