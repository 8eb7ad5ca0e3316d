"""Which of the assigned GPUs a tensor-parallel group uses when it needs fewer than it was given.

TP ranks exchange activations at every layer (all-reduce), so the group should be the best
connected subset: every pair on NVLink first, then the fewest pairs crossing NUMA nodes (SYS)
or PCIe host bridges (NODE), then GPUs on one NUMA node, then the better PCIe paths and more
NVLinks. Ties go to the lowest indices, so a fully connected host keeps the first GPUs. Pure:
the links come from the recorded or probed host (`Host.links`); unknown links tie.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

from dankserve.host.model import LINK_KINDS, Gpu, Host
from dankserve.plan.rules import Decision

_UNKNOWN_RANK = len(LINK_KINDS)  # an unrecorded pair ranks below SYS


def _link_rank(host: Host, a: Gpu, b: Gpu) -> tuple[int, int]:
    """(position of the pair's kind in LINK_KINDS, minus its NVLinks): lower is better."""
    link = host.link(a.index, b.index)
    if link is None:
        return _UNKNOWN_RANK, 0
    return LINK_KINDS.index(link.kind), -(link.nvlinks or 0)


def numa_span(host: Host, gpus: Sequence[Gpu]) -> int:
    """How many NUMA nodes the GPUs sit on (1 when the host has one node or a GPU's node is unknown)."""
    nodes = {gpu.numa_node for gpu in gpus}
    if len(host.numa_nodes) <= 1 or None in nodes:
        return 1
    return len(nodes)


def connection_key(host: Host, gpus: Sequence[Gpu]) -> tuple[int, ...]:
    """How well a set of GPUs is connected, as a sort key (smaller is better)."""
    ranks = [_link_rank(host, a, b) for a, b in combinations(gpus, 2)]
    kinds = [rank for rank, _ in ranks]
    nvlink = LINK_KINDS.index("NVLINK")
    return (
        int(any(kind != nvlink for kind in kinds)),
        kinds.count(LINK_KINDS.index("SYS")) + kinds.count(_UNKNOWN_RANK),
        kinds.count(LINK_KINDS.index("NODE")),
        numa_span(host, gpus),
        sum(kinds),
        sum(minus_links for _, minus_links in ranks),
    )


def describe(host: Host, gpus: Sequence[Gpu]) -> str:
    """The chosen set's connection in words: which GPUs, their worst link and NUMA nodes."""
    names = ", ".join(str(gpu.index) for gpu in gpus)
    labels = []
    for a, b in combinations(gpus, 2):
        link = host.link(a.index, b.index)
        labels.append("?" if link is None else link.label())
    if not labels or host.links is None:
        links = ""
    elif all(label.startswith("NV") for label in labels):
        links = f", every pair on NVLink ({'/'.join(sorted(set(labels)))})"
    else:
        links = f", links {'/'.join(sorted(set(labels)))}"
    nodes = sorted({gpu.numa_node for gpu in gpus if gpu.numa_node is not None})
    numa = f", NUMA node{'s' if len(nodes) > 1 else ''} {'/'.join(map(str, nodes))}" if len(host.numa_nodes) > 1 else ""
    return f"GPUs {names}{links}{numa}"


def choose_gpus(host: Host, assigned: Sequence[Gpu], count: int) -> Decision[tuple[Gpu, ...]]:
    """The `count` best-connected of the assigned GPUs (all of them when `count` covers them), and why."""
    ordered = tuple(sorted(assigned, key=lambda gpu: gpu.index))
    if count >= len(ordered):
        return Decision(ordered, f"all {len(ordered)} assigned GPUs")
    # combinations come in index order and min keeps the first of equals: ties go to the lowest indices
    candidates = list(combinations(ordered, count))
    best = min(candidates, key=lambda gpus: connection_key(host, gpus))
    if host.links is None:
        why = "links between GPUs not recorded" + (
            ", so the GPUs on the fewest NUMA nodes" if len(host.numa_nodes) > 1 else ", so the first ones"
        )
    elif all(connection_key(host, gpus) == connection_key(host, best) for gpus in candidates):
        why = "all equally connected, so the first ones"
    else:
        why = f"the best connected of the {len(candidates)} choices of {count} of {len(ordered)}"
    return Decision(best, f"{describe(host, best)} ({why})")
