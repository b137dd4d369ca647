"""Placement by topology: the best-linked set among the GPUs a policy offers, and what
`--topology strict` waits for (placement.py's choice, with core/sched/topology.py's links)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from gpusched.core.models import GpuInfo, Request
from gpusched.core.sched import topology

if TYPE_CHECKING:  # placement imports this module
    from gpusched.core.sched.placement import GpuLoad


def _whole(gpus: Sequence[GpuInfo], links: Sequence[Sequence[str]]) -> bool:
    """Whether topology applies: whole GPUs the link matrix covers (MIG devices have no
    peer-to-peer links of their own)."""
    return bool(links) and all(g.parent_index is None and g.index < len(links) for g in gpus)


def best_linked(
    request: Request,
    ordered: Sequence[GpuInfo],
    loads: Mapping[str, GpuLoad],
    links: Sequence[Sequence[str]],
) -> Sequence[GpuInfo] | None:
    """The policy's first GPUs, or the best-linked set among them; None when --topology
    strict would have to take a set linked worse than the box allows."""
    if request.gpus <= 1 or not _whole(ordered, links):
        return ordered[: request.gpus]
    by_index = {g.index: g for g in ordered}
    chosen = topology.best_set([g.index for g in ordered], request.gpus, links)
    if request.constraints.topology == "strict":
        best = _best_rank(request, loads, links)
        if best is not None and topology.set_cost(chosen, links)[0] > best:
            return None
    return [by_index[i] for i in chosen]


def _best_rank(
    request: Request, loads: Mapping[str, GpuLoad], links: Sequence[Sequence[str]]
) -> int | None:
    """The worst link of the best set the allowed healthy GPUs could ever give."""
    allowed = sorted(
        load.gpu.index
        for load in loads.values()
        if load.gpu.is_healthy and request.constraints.allows(load.gpu)
    )
    if len(allowed) < request.gpus or not _whole([load.gpu for load in loads.values()], links):
        return None
    return topology.best_possible_rank(allowed, request.gpus, links)


def strict_reason(
    request: Request,
    fitting: Sequence[GpuLoad],
    loads: Mapping[str, GpuLoad],
    links: Sequence[Sequence[str]],
) -> str:
    """Why a --topology strict job waits although enough GPUs are free."""
    best = _best_rank(request, loads, links)
    free = topology.best_set(sorted(load.gpu.index for load in fitting), request.gpus, links)
    worst = topology.set_cost(free, links)[0]
    return (
        f"--topology strict: waits for {request.gpus} GPUs linked by "
        f"{topology.rank_label(best or 0)}; the free ones "
        f"({', '.join(map(str, free))}) would cross {topology.rank_label(worst)}"
    )
