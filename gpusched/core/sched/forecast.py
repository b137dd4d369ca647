"""When pending jobs will start (pure), as Slurm's `squeue --start`: a dry run of the queue
as it stands through the pass the daemon runs (core/sched/scheduling.py), each job taking
its expected runtime (core/sched/runtimes.py), with no new jobs coming.

Three dry runs make a forecast: with each job's median runtime (the forecast), and with
each at the low and at the high end of its runs (the 80 % interval).
"""

from __future__ import annotations

import heapq
import itertools
import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from gpusched.core.models import Inventory, Job, JobState, job_with
from gpusched.core.sched import placement, reservations, runtimes
from gpusched.core.sched.pendingqueue import PendingQueue
from gpusched.core.sched.placement import GpuLoad, PlacementRules
from gpusched.core.sched.queuerules import QueueRules, fair_share, queue_order
from gpusched.core.sched.reservations import Reservation
from gpusched.core.sched.scheduling import schedule

# The pending jobs a forecast plays out, in queue order (the rest get none), and the
# instants it plays at most: a request stays cheap however long the queue (500 jobs of
# mixed sizes on 8 GPUs: about 0.1 s a dry run, three a forecast).
MAX_JOBS = 500
MAX_INSTANTS = 4000
PICKS = ("median", "low", "high")


@dataclass(frozen=True)
class Forecast:
    start: float  # epoch seconds
    low: float  # the 80 % interval; high None: no end (a dry run found no start)
    high: float | None


def runtime_s(job: Job, pick: str = "median") -> float | None:
    """A job's runtime in a dry run: its prediction at `pick` (no longer than its --time),
    else its --time; None (it never ends) with neither."""
    predicted = {
        "median": job.predicted_s,
        "low": job.predicted_low_s,
        "high": job.predicted_high_s,
    }[pick]
    if predicted is None:
        return job.time_limit_s
    return predicted if job.time_limit_s is None else min(predicted, job.time_limit_s)


def _end(job: Job, now: float, pick: str) -> float:
    """When a running job is expected to end: its remaining time, floored (runtimes.py)."""
    total = runtime_s(job, pick)
    if total is None:
        return math.inf
    start = job.started_at if job.started_at is not None else now
    if job.time_limit_s is not None and total >= job.time_limit_s:
        return max(start + job.time_limit_s, now)
    # Past its median a job is expected to run on to its high end; the low and high runs
    # take their own ends, then the floor.
    high = runtime_s(job, "high") if pick == "median" else None
    return now + runtimes.remaining_s(now - start, total, high)


def idle(inventory: Inventory) -> Inventory:
    """The box with only gpusched's jobs on it: what a dry run sees after its first instant."""
    return replace(
        inventory,
        gpus=tuple(
            replace(gpu, mem_used_bytes=0, util_pct=0.0, processes=()) for gpu in inventory.gpus
        ),
    )


def dry_run(
    pending: Sequence[Job],
    running: Sequence[Job],
    loads: Mapping[str, GpuLoad],
    inventory: Inventory,
    rules: PlacementRules,
    queue: QueueRules,
    now: float,
    pick: str = "median",
    usage: Mapping[str, float] | None = None,
    attained: Mapping[int, float] | None = None,
    until_id: int | None = None,
    reserved: Mapping[str, Reservation] | None = None,
) -> dict[int, float]:
    """Job id -> when it starts in a dry run from now (`loads`: the GPUs' now), for the
    pending jobs that start in it (until_id: stop once that one has). Dependencies count
    as they stand now, preemption not; GPU reservations (`reserved`) as they open and close."""
    waiting = {
        job.id: job
        for job in queue_order(list(pending), queue, usage or {}, now, attained)[:MAX_JOBS]
    }
    live = {job.id: job for job in running}
    ends = [(_end(job, now, pick), job.id) for job in running]
    heapq.heapify(ends)
    empty, t = idle(inventory), now
    starts: dict[int, float] = {}
    placements: dict[int, int] = {}
    # The queue kept as the daemon keeps it, so that a pass stops once nothing left can
    # start (core/sched/pendingqueue.py); las's order moves with time: sorted each pass.
    per_user = bool(queue.quotas)
    line = None if queue.discipline == "las" else PendingQueue(queue.discipline, per_user)
    if line is not None:
        line.add_many(waiting.values())
    share = fair_share(queue, usage or {})
    # When waiting jobs' --begin times and retry delays run out, and reservations start
    # and end: instants to play at.
    eligible = sorted(
        when
        for when in itertools.chain(
            (w for job in waiting.values() for w in (job.begin_time, job.eligible_at)),
            reservations.times((reserved or {}).values()),
        )
        if when is not None and when > now
    )
    for _ in range(MAX_INSTANTS):
        plan = schedule(
            line.jobs(waiting, share) if line is not None else list(waiting.values()),
            list(live.values()),
            loads,
            inventory,
            rules,
            queue,
            t,
            usage=usage,
            placements=placements,
            explain=False,
            line=line,
            attained=attained,
            reserved=reserved,
        )
        placements = dict(plan.placements)
        for job_id, gpus in plan.starts:
            job = waiting.pop(job_id)
            if line is not None:
                line.remove(job)
            started = job_with(
                job, state=JobState.RUNNING, started_at=t, gpu_uuids=tuple(g.uuid for g in gpus)
            )
            live[job_id], starts[job_id] = started, t
            heapq.heappush(ends, (_end(started, t, pick), job_id))
        for job_id in plan.cancels:
            if (cancelled := waiting.pop(job_id, None)) is not None and line is not None:
                line.remove(cancelled)
        at = bisect_right(eligible, t)
        t = min(ends[0][0] if ends else math.inf, eligible[at] if at < len(eligible) else math.inf)
        if not waiting or t == math.inf or until_id in starts:
            break
        while ends and ends[0][0] <= t:
            live.pop(heapq.heappop(ends)[1], None)
        loads = placement.gpu_loads(empty, list(live.values()), {}, rules)
    return starts


def forecasts(
    pending: Sequence[Job],
    running: Sequence[Job],
    loads: Mapping[str, GpuLoad],
    inventory: Inventory,
    rules: PlacementRules,
    queue: QueueRules,
    now: float,
    usage: Mapping[str, float] | None = None,
    attained: Mapping[int, float] | None = None,
    until_id: int | None = None,
    reserved: Mapping[str, Reservation] | None = None,
) -> dict[int, Forecast]:
    """Each pending job's forecast start with its 80 % interval (three dry runs; until_id:
    that job's at least, the dry runs stop once it has started)."""
    runs = {
        pick: dry_run(
            pending,
            running,
            loads,
            inventory,
            rules,
            queue,
            now,
            pick,
            usage,
            attained,
            until_id,
            reserved,
        )
        for pick in PICKS
    }
    out = {}
    for job_id, start in runs["median"].items():
        low_run, high_run = runs["low"].get(job_id), runs["high"].get(job_id)
        known = [start, *(t for t in (low_run, high_run) if t is not None)]
        # A job the high run never starts: the interval has no end.
        out[job_id] = Forecast(start, min(known), max(known) if high_run is not None else None)
    return out
