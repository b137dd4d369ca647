"""Pure preemption: which running jobs to stop so that an urgent pending job can start.

The daemon (daemon/jobs/preempt.py) and the trace simulator (`simulate --preemption`) both call
choose_victims, so the simulator measures the very choices the daemon makes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpusched.core.models import Job
from gpusched.core.sched import placement
from gpusched.core.sched.placement import GpuLoad, PlacementRules

# Above this many candidates the search for the fewest victims is greedy (add the
# cheapest until the job fits, then drop any it does not need): the exact search
# tries every subset of a size, and a box rarely runs more jobs than this.
EXACT_SEARCH_MAX = 10


@dataclass(frozen=True)
class PreemptionRules:
    """The [preemption] settings a choice depends on."""

    enabled: bool = True
    max_preemptions: int = 3  # a job is preempted at most this often (0: no limit)
    min_run_s: float = 300.0  # never in its first minutes: it has had no time to checkpoint
    # max_preemptions for a job of the victim's priority (las): none by default, as its
    # figures in docs/scheduling.md show best.
    las_max_preemptions: int = 0


def victim_key(job: Job, now: float) -> tuple[int, float, int]:
    """The cheapest victim first: the lowest priority, then the least run time lost."""
    return (job.priority, now - (job.started_at if job.started_at is not None else now), -job.id)


# Whether the first job (urgent) ranks above the second (a running one): queuerules.outranks.
Outranks = Callable[[Job, Job], bool]


def _higher_priority(urgent: Job, victim: Job) -> bool:
    return urgent.priority > victim.priority


def can_preempt(
    victim: Job,
    urgent: Job,
    rules: PreemptionRules,
    now: float,
    outranks: Outranks = _higher_priority,
) -> bool:
    """Whether `victim` may be stopped for `urgent`: preemptible, ranked lower (a lower
    priority, or under las a later queue), run long enough, not preempted too often (for
    a job of its priority, under las: las_max_preemptions), and not already on its way out."""
    if not (victim.is_running and victim.preemptible and outranks(urgent, victim)):
        return False
    if victim.requeueing or victim.cancel_requested:
        return False
    limit = (
        rules.las_max_preemptions if urgent.priority == victim.priority else rules.max_preemptions
    )
    if limit and victim.preemptions >= limit:
        return False
    started = victim.started_at if victim.started_at is not None else now
    return now - started >= rules.min_run_s


def loads_without(
    loads: Mapping[str, GpuLoad], victims: Sequence[Job], observed: Mapping[tuple[int, str], int]
) -> dict[str, GpuLoad]:
    """The GPU loads as they would be once the victims stopped: their places and promised
    memory gone, and the memory the driver sees them hold counted as free."""
    out = dict(loads)
    for victim in victims:
        for uuid in victim.gpu_uuids:
            load = out.get(uuid)
            if load is None:
                continue
            used = observed.get((victim.id, uuid), 0)
            declared = placement._declared_bytes(victim, load.gpu)
            ids = tuple(i for i in load.job_ids if i != victim.id)
            # How busy the GPU is was the victims' doing once no job of ours is left: not
            # known then, rather than their last reading (placement skips busy GPUs).
            gpu = load.gpu if ids else replace(load.gpu, util_pct=None)
            out[uuid] = replace(
                load,
                gpu=gpu,
                job_ids=ids,
                ours_used_bytes=max(0, load.ours_used_bytes - used),
                ignored_outside_bytes=load.ignored_outside_bytes + used,
                promised_bytes=max(0, load.promised_bytes - max(0, declared - used)),
                # A whole GPU (or MIG device) has one job: once it goes, no one holds it.
                is_held_exclusively=load.is_held_exclusively and bool(ids),
            )
    return out


def choose_victims(
    urgent: Job,
    running: Sequence[Job],
    loads: Mapping[str, GpuLoad],
    rules: PlacementRules,
    preemption: PreemptionRules,
    now: float,
    observed: Mapping[tuple[int, str], int] | None = None,
    outranks: Outranks = _higher_priority,
) -> tuple[Job, ...] | None:
    """The fewest preemptible running jobs whose stop lets `urgent` start, cheapest first
    (victim_key), never one more than needed; None when no such set exists (or the
    job fits already, or preemption is off). `loads` are the GPUs as placement sees them
    now (placement.gpu_loads), `observed` what each job holds on each GPU."""
    if not preemption.enabled or not urgent.request.gpus:
        return None
    observed = observed or {}
    if _fits(urgent, loads, rules):
        return None
    candidates = sorted(
        (j for j in running if can_preempt(j, urgent, preemption, now, outranks)),
        key=lambda j: victim_key(j, now),
    )
    if not candidates or not _fits(urgent, loads_without(loads, candidates, observed), rules):
        return None
    if len(candidates) <= EXACT_SEARCH_MAX:
        return _fewest_exact(urgent, candidates, loads, rules, observed, now)
    return _fewest_greedy(urgent, candidates, loads, rules, observed)


def _fits(urgent: Job, loads: Mapping[str, GpuLoad], rules: PlacementRules) -> bool:
    return placement.choose_gpus(urgent.request, loads, rules, {}, urgent.policy) is not None


def _fewest_exact(
    urgent: Job,
    candidates: list[Job],
    loads: Mapping[str, GpuLoad],
    rules: PlacementRules,
    observed: Mapping[tuple[int, str], int],
    now: float,
) -> tuple[Job, ...] | None:
    """The smallest set that fits; among sets of that size, the cheapest (the costliest
    victim as cheap as can be, then the next...)."""
    for size in range(1, len(candidates) + 1):
        fitting = [
            combo
            for combo in itertools.combinations(candidates, size)
            if _fits(urgent, loads_without(loads, combo, observed), rules)
        ]
        if fitting:
            return min(
                fitting, key=lambda combo: sorted((victim_key(j, now) for j in combo), reverse=True)
            )
    return None


def _fewest_greedy(
    urgent: Job,
    candidates: list[Job],
    loads: Mapping[str, GpuLoad],
    rules: PlacementRules,
    observed: Mapping[tuple[int, str], int],
) -> tuple[Job, ...] | None:
    chosen: list[Job] = []
    for job in candidates:
        chosen.append(job)
        if _fits(urgent, loads_without(loads, chosen, observed), rules):
            break
    for job in reversed(list(chosen)):  # the costliest first: drop what is not needed
        rest = [j for j in chosen if j is not job]
        if _fits(urgent, loads_without(loads, rest, observed), rules):
            chosen = rest
    return tuple(chosen)


def held_gpus(pending: Sequence[Job]) -> dict[str, int]:
    """GPU uuid -> the urgent job its victims' GPUs are kept for, while it waits."""
    return {uuid: job.id for job in pending for uuid in job.preempt_hold}


def job_defaults(
    user: str,
    preemptible: bool | None,
    grace_s: float | None,
    default_preemptible: bool,
    user_defaults: Mapping[str, bool],
    default_grace_s: float,
) -> tuple[bool, float]:
    """A new job's (preemptible, grace): as submitted, else the user's default from the
    config, else the config's."""
    if preemptible is None:
        preemptible = user_defaults.get(user, default_preemptible)
    return preemptible, default_grace_s if grace_s is None else grace_s
