"""What one scheduling pass has placed so far, and where a job fits now: the counts a pass
keeps (GPU loads, per-user and per-array counts, host cores and memory, when each GPU's
jobs are expected to end), the GPUs for a job, and backfill's reservation (EASY). The
pass itself, its order and its reasons are core/sched/scheduling.py's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpusched.core.models import GpuInfo, Job, Request
from gpusched.core.sched import placement, runtimes
from gpusched.core.sched.placement import GpuLoad, PlacementRules
from gpusched.core.sched.quotas import Limit

# A request, its policy, the job the GPUs are held for (None: none) and the GPUs closed
# to it by reservations, found not to fit.
Unplaceable = tuple[Request, str, int | None, frozenset[int]]


@dataclass
class PassCounts:
    """Bookkeeping while one scheduling pass places jobs."""

    loads: dict[str, GpuLoad]
    placements: dict[int, int]
    user_gpus: dict[str, int]
    user_jobs: dict[str, int]
    array_running: dict[int, int]
    ends: dict[str, float]  # GPU uuid -> when its last job is expected to end
    cpus_used: int = 0
    mem_used_bytes: int = 0
    running: int = 0
    # (start, GPUs the reserved job may use, how many it needs, its id)
    reservation: tuple[float, frozenset[str], int, int] | None = None
    links: tuple[tuple[str, ...], ...] = ()  # the inventory's topology
    usable_gpus: int = -1  # GPUs placement.is_usable takes, counted when asked (-1: not yet)
    user_gpu_mem: dict[str, int] = field(default_factory=dict)  # bytes (job_gpu_mem)
    # Each user's quota limits, looked up once a pass (the time of day is the pass's).
    user_limits: dict[str, dict[str, Limit]] = field(default_factory=dict)


def expected_end(job: Job, now: float, reserving: bool = False) -> float:
    """When a job (running, or starting now) is expected to end: at its --time, else by
    its predicted runtime (never before now); never, with neither. reserving: the end a
    reservation counts on, the high end of the prediction (its 90th percentile)."""
    start = job.started_at if job.started_at is not None else now
    if job.time_limit_s is not None:
        return start + job.time_limit_s
    if job.predicted_s is None:
        return math.inf
    high = job.predicted_high_s
    predicted = high if reserving and high is not None else job.predicted_s
    return now + runtimes.remaining_s(now - start, predicted, high)


def new_pass(
    running: Sequence[Job], loads: Mapping[str, GpuLoad], placements: Mapping[int, int], now: float
) -> PassCounts:
    p = PassCounts(dict(loads), dict(placements), {}, {}, {}, {})
    for job in running:
        count_job(p, job, job.gpu_uuids, now)
    return p


def count_job(p: PassCounts, job: Job, uuids: Sequence[str], now: float) -> None:
    p.cpus_used += job.request.cpus
    p.mem_used_bytes += job.request.mem_bytes or 0
    p.running += 1
    p.user_gpus[job.user] = p.user_gpus.get(job.user, 0) + job.request.gpus
    p.user_jobs[job.user] = p.user_jobs.get(job.user, 0) + 1
    mem = job_gpu_mem(job, uuids, p.loads)
    if mem:
        p.user_gpu_mem[job.user] = p.user_gpu_mem.get(job.user, 0) + mem
    if job.array_id is not None:
        p.array_running[job.array_id] = p.array_running.get(job.array_id, 0) + 1
    end = expected_end(job, now, reserving=True)
    for uuid in uuids:
        p.ends[uuid] = max(p.ends.get(uuid, now), end)


def job_gpu_mem(job: Job, uuids: Sequence[str], loads: Mapping[str, GpuLoad]) -> int:
    """The GPU memory a job holds on these GPUs (quotas' max_gpu_mem): its --gpu-mem on
    each, or for whole GPUs, all of theirs."""
    if job.request.gpu_mem_bytes is not None:
        return job.request.gpu_mem_bytes * len(uuids)
    return sum(loads[u].gpu.mem_total_bytes for u in uuids if u in loads)


def take(p: PassCounts, job: Job, chosen: Sequence[GpuInfo], now: float) -> None:
    """Count a job the pass starts on these GPUs."""
    placement.take(p.loads, job, chosen)
    p.usable_gpus = -1
    for gpu in chosen:
        p.placements[gpu.index] = p.placements.get(gpu.index, 0) + 1
    count_job(p, job, [g.uuid for g in chosen], now)


def reserve(job: Job, p: PassCounts, rules: PlacementRules, now: float) -> None:
    """EASY backfill: the first blocked job is promised the soonest time enough GPUs free up."""
    allowed = [
        load
        for load in p.loads.values()
        if load.gpu.is_healthy and job.request.constraints.allows(load.gpu)
    ]
    if len(allowed) < job.request.gpus:
        return
    ends = sorted(p.ends.get(load.gpu.uuid, now) for load in allowed)
    start = ends[job.request.gpus - 1]
    p.reservation = (start, frozenset(load.gpu.uuid for load in allowed), job.request.gpus, job.id)


def delays_reservation(job: Job, gpus: Sequence[GpuInfo], p: PassCounts, now: float) -> bool:
    """Whether the reserved job would find too few GPUs free at its reserved start.

    A job that ends by then never delays it; a longer one may still take the GPUs that
    will be spare at that time (EASY's "extra nodes"), not only ones it will never want.
    """
    if p.reservation is None:
        return False
    start, allowed, need, _ = p.reservation
    if expected_end(job, now) <= start:
        return False
    taken = {g.uuid for g in gpus}
    free_at_start = sum(
        1 for uuid in allowed if uuid not in taken and p.ends.get(uuid, now) <= start
    )
    return free_at_start < need


def gpus_for(
    job: Job,
    p: PassCounts,
    rules: PlacementRules,
    unplaceable: set[Unplaceable],
    held: Mapping[str, int] | None = None,
    closed: frozenset[int] = frozenset(),
) -> tuple[GpuInfo, ...] | None:
    """The GPUs for a job now, or None when it does not fit.

    Loads only fill up during a pass, so a request that found too few GPUs once finds too
    few again: remember it, and a long queue of alike jobs costs one search, not one each.
    Only built-in policies qualify: a custom one may veto GPUs by placement counts.
    `held`: GPUs kept for a job that preempted others (uuid -> its id): no other job gets them.
    `closed`: indices of GPUs reservations keep the job off (core/sched/reservations.py).
    """
    if not job.request.gpus:
        return ()
    holder = job.id if held and job.id in held.values() else None
    key = (job.request, job.policy or rules.policy, holder, closed)
    if key in unplaceable:
        return None
    loads: Mapping[str, GpuLoad] | None
    if held or closed:
        loads = {
            uuid: load
            for uuid, load in p.loads.items()
            if (not held or held.get(uuid, job.id) == job.id) and load.gpu.index not in closed
        }
    elif count_usable(p) < job.request.gpus:
        loads = None  # too few for any policy: choose_gpus needs that many that fit
    else:
        loads = p.loads
    chosen = (
        None
        if loads is None
        else placement.choose_gpus(job.request, loads, rules, p.placements, job.policy, p.links)
    )
    if chosen is None and key[1] in placement.BUILTIN_POLICIES:
        unplaceable.add(key)
    return chosen


def count_usable(p: PassCounts) -> int:
    """How many GPUs could take a job now, at most: a pass asks it of each shape it
    weighs, and it changes only when a job starts."""
    if p.usable_gpus < 0:
        p.usable_gpus = sum(1 for load in p.loads.values() if placement.is_usable(load))
    return p.usable_gpus


def counts_now(p: PassCounts) -> PassCounts:
    """A copy of the pass's counts, which a start changes in place."""
    return replace(
        p,
        loads=dict(p.loads),
        placements=dict(p.placements),
        user_gpus=dict(p.user_gpus),
        user_jobs=dict(p.user_jobs),
        user_gpu_mem=dict(p.user_gpu_mem),
        array_running=dict(p.array_running),
        ends=dict(p.ends),
    )
