"""GPU connectivity: link labels as `nvidia-smi topo -m` prints them, and the best-linked GPU set.

A topology is a square matrix of link labels between whole GPUs, in inventory order:
"X" on the diagonal, "NV<n>" for n NVLinks (directly or through an NVSwitch), then the
PCIe distances from nearest to farthest: PIX (one PCIe switch), PXB (several switches),
PHB (a host bridge), NODE (host bridges within one NUMA node), SYS (across sockets).
An empty matrix means the backend could not tell: placement then ignores topology.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from itertools import combinations
from math import comb

# PCIe levels from nearest to farthest; every NV<n> is nearer than all of them.
PCIE_LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")
LEGEND = (
    ("X", "Self"),
    (
        "SYS",
        "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes "
        "(e.g., QPI/UPI)",
    ),
    (
        "NODE",
        "Connection traversing PCIe as well as the interconnect between PCIe Host "
        "Bridges within a NUMA node",
    ),
    ("PHB", "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)"),
    (
        "PXB",
        "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
    ),
    ("PIX", "Connection traversing at most a single PCIe bridge"),
    ("NV#", "Connection traversing a bonded set of # NVLinks"),
)
TOPOLOGY_MODES = ("best", "strict")
# Beyond this many candidate sets the choice is greedy (one set grown from each GPU):
# C(8, 4) = 70 sets are searched exactly, a 64-GPU box is not.
EXACT_SEARCH_MAX_SETS = 500


def link_rank(label: str) -> int:
    """0 for NVLink (any count), then 1 (PIX) to 5 (SYS); unknown labels rank as SYS."""
    if label.startswith("NV"):
        return 0
    if label in PCIE_LEVELS:
        return PCIE_LEVELS.index(label) + 1
    return len(PCIE_LEVELS)


@lru_cache(maxsize=8)
def _rank_matrix(links: tuple[tuple[str, ...], ...]) -> tuple[tuple[int, ...], ...]:
    # One box's links rarely change: ranked once, not in every placement pass.
    return tuple(tuple(map(link_rank, row)) for row in links)


def _ranks(links: Sequence[Sequence[str]]) -> tuple[tuple[int, ...], ...]:
    return _rank_matrix(tuple(map(tuple, links)))


def set_cost(indices: Sequence[int], links: Sequence[Sequence[str]]) -> tuple[int, int]:
    """(worst link rank, sum of link ranks) over every pair: smaller is better connected.

    The worst link comes first: a set that spans two NVLink islands talks at PCIe speed
    in its all-reduce, however well the rest of it is linked.
    """
    return _cost(indices, _ranks(links))


def _cost(indices: Sequence[int], ranks: Sequence[Sequence[int]]) -> tuple[int, int]:
    pair_ranks = [ranks[a][b] for a, b in combinations(indices, 2)]
    return (max(pair_ranks, default=0), sum(pair_ranks))


def best_set(ordered: Sequence[int], count: int, links: Sequence[Sequence[str]]) -> tuple[int, ...]:
    """The `count` GPUs of `ordered` (positions in `links`, most preferred first) with the
    lowest set_cost; among equally linked sets, the one the placement policy prefers.

    Without topology, or for one GPU, it is the policy's first `count`: boxes without
    topology information are placed exactly as before.
    """
    if not links or count <= 1 or len(ordered) <= count:
        return tuple(ordered[:count])
    rank = {gpu: pos for pos, gpu in enumerate(ordered)}
    ranks = _ranks(links)

    def key(chosen: Sequence[int]) -> tuple[int, int, list[int]]:
        return (*_cost(chosen, ranks), sorted(rank[g] for g in chosen))

    if comb(len(ordered), count) <= EXACT_SEARCH_MAX_SETS:
        best = min(combinations(ordered, count), key=key)
    else:
        best = min((_grow(seed, ordered, count, ranks) for seed in ordered), key=key)
    return tuple(sorted(best, key=rank.__getitem__))


def _grow(
    seed: int, ordered: Sequence[int], count: int, ranks: Sequence[Sequence[int]]
) -> tuple[int, ...]:
    """A set grown from `seed`, each step adding the GPU whose worst link to it is best
    (its worst and summed links to the set kept up to date: n steps of n, not n^2)."""
    chosen = [seed]
    reach = {g: (ranks[g][seed], ranks[g][seed]) for g in ordered if g != seed}
    while len(chosen) < count:
        pick = min(reach, key=reach.__getitem__)  # dicts keep the policy's order on ties
        del reach[pick]
        chosen.append(pick)
        for g, (worst, total) in reach.items():
            reach[g] = (max(worst, ranks[g][pick]), total + ranks[g][pick])
    return tuple(chosen)


def best_possible_rank(allowed: Sequence[int], count: int, links: Sequence[Sequence[str]]) -> int:
    """The worst-link rank of the best set this box could ever give (all GPUs free):
    what `--topology strict` waits for."""
    return set_cost(best_set(allowed, count, links), links)[0]


def rank_label(rank: int) -> str:
    return "NVLink" if rank == 0 else PCIE_LEVELS[rank - 1]


def nvlink_islands(groups: str, gpu_count: int) -> list[list[str]]:
    """The link matrix of a simulated box: 'nvlink=0-3,4-7' links each group all-to-all
    (NV18, as an H100's 18 links); GPUs of one group share a NUMA node, groups cross SYS."""
    members: list[list[int]] = []
    for group in filter(None, groups.split(",")):
        first, _, last = group.partition("-")
        try:
            span = list(range(int(first), int(last or first) + 1))
        except ValueError:
            raise ValueError(f"bad NVLink group {group!r}: write e.g. nvlink=0-3,4-7") from None
        if not span or span[-1] >= gpu_count or any(g in m for m in members for g in span):
            raise ValueError(
                f"bad NVLink group {group!r}: use GPUs 0-{gpu_count - 1}, each "
                "in one group, e.g. nvlink=0-3,4-7"
            )
        members.append(span)
    group_of: Mapping[int, int] = {g: n for n, span in enumerate(members) for g in span}
    return [
        [
            "X" if a == b else "NV18" if group_of.get(a, -1) == group_of.get(b, -2) else "SYS"
            for b in range(gpu_count)
        ]
        for a in range(gpu_count)
    ]


def cpu_ranges(cpu_ids: Sequence[int]) -> str:
    """0-47,96-143 for the CPU Affinity column; N/A when unknown."""
    runs: list[list[int]] = []
    for cpu in sorted(cpu_ids):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "N/A"
