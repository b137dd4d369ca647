"""The queue's rules (its discipline, quotas, the host's capacity) and the order
they put pending jobs in; fair-share usage, in GPU-seconds, which that order may weigh.

Apart from the pass (core/sched/scheduling.py) so that the config, the simulator and the
daemon's accounting use them without the scheduler.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

# DISCIPLINES, the names QueueRules.discipline takes, lives in models for the command line.
from gpusched.core.models import DISCIPLINES, Job
from gpusched.core.sched.quotas import Quotas, local_minute


def no_groups(user: str) -> Sequence[str]:
    return ()


@dataclass(frozen=True)
class HostCapacity:
    """What the host offers jobs besides GPUs: cores and memory after the system's reserve."""

    cpus: int
    mem_bytes: int
    max_running: int | None = None  # at most this many jobs at once (tsp -S)


@dataclass(frozen=True)
class QueueRules:
    # fifo: priority, then submission, skipping jobs that do not fit (the default).
    # backfill: fifo, but a later job may not delay the first blocked job's reserved start.
    # fairshare: priority, then the user's decayed usage over their weight.
    # sjf: priority, then the shortest time limit (exact durations make it the oracle).
    # las: priority, then the queue of the GPU-seconds attained so far, then submission.
    discipline: str = DISCIPLINES[0]
    user_weights: Mapping[str, float] = field(default_factory=dict)
    quotas: Quotas = field(default_factory=Quotas)
    # A user's Unix groups (the daemon reads the group database; the simulator, its map),
    # and the minute of the day the quotas' windows are read in.
    groups_of: Callable[[str], Sequence[str]] = no_groups
    minute_of: Callable[[float], float] = local_minute
    draining: bool = False
    host: HostCapacity | None = None  # None: host resources are not counted (the simulator)
    # las: queue k holds the jobs that attained below the k-th bound (GPU-seconds); the
    # last, the rest. A job that waited factor x its attained service (and the floor) is
    # put back in the first queue, so that a long job is never starved for good.
    las_thresholds_gpu_s: tuple[float, ...] = (2 * 3600.0, 8 * 3600.0)
    las_starvation_factor: float = 4.0
    las_starvation_floor_s: float = 3600.0
    # las: a job that has waited this long may also preempt jobs of its own queue on
    # fewer GPUs (0: never), so that small new jobs, which take each GPU as it frees,
    # do not keep a big job waiting for good (the starvation guard cannot: it is in
    # the first queue already).
    las_preempt_smaller_after_s: float = 4 * 3600.0


def attained_gpu_s(job: Job, earlier: Mapping[int, float], now: float) -> float:
    """The GPU-seconds a job has received: its earlier runs' (`earlier`, by job id: a
    preempted and requeued job keeps them), plus the current run's so far."""
    done = earlier.get(job.id, 0.0)
    if job.is_running and job.started_at is not None:
        done += max(job.request.gpus, 0) * max(now - job.started_at, 0.0)
    return done


def las_queue(job: Job, rules: QueueRules, earlier: Mapping[int, float], now: float) -> int:
    """The las queue (0: the first) a job is in now: by attained service, unless it has
    waited long enough to be moved to the first (a running job does not wait)."""
    attained = attained_gpu_s(job, earlier, now)
    if not job.is_running:
        waited_s = now - waiting_since(job)
        if waited_s >= max(rules.las_starvation_floor_s, rules.las_starvation_factor * attained):
            return 0
    return bisect_right(rules.las_thresholds_gpu_s, attained)


def waiting_since(job: Job) -> float:
    """When a pending job last joined the queue: its submission, or its last preemption."""
    return job.preempted_at if job.preempted_at is not None else job.submitted_at


def las_preempts_smaller(job: Job, rules: QueueRules, now: float) -> bool:
    """Whether a waiting las job may also preempt jobs of its own queue on fewer GPUs:
    it has waited las_preempt_smaller_after_s."""
    after = rules.las_preempt_smaller_after_s
    return bool(after and now - waiting_since(job) >= after)


def las_label(queue: int, rules: QueueRules) -> str:
    """The queue as the pending reason names it."""
    return f"las queue {queue + 1} of {len(rules.las_thresholds_gpu_s) + 1}"


def outranks(
    urgent: Job, victim: Job, rules: QueueRules, earlier: Mapping[int, float], now: float
) -> bool:
    """Whether `urgent` may take `victim`'s GPUs: a higher priority, or under las, the
    same priority and a higher queue (an earlier one), or the same queue once `urgent`
    has waited las_preempt_smaller_after_s and the victim uses fewer GPUs."""
    if urgent.priority != victim.priority or rules.discipline != "las":
        return urgent.priority > victim.priority
    mine, theirs = las_queue(urgent, rules, earlier, now), las_queue(victim, rules, earlier, now)
    if victim.request.gpus < urgent.request.gpus and las_preempts_smaller(urgent, rules, now):
        return mine <= theirs
    return mine < theirs


def order_key(
    job: Job,
    rules: QueueRules,
    usage: Mapping[str, float],
    now: float = 0.0,
    attained: Mapping[int, float] | None = None,
) -> tuple[float, ...]:
    if rules.discipline == "las":
        return (-job.priority, las_queue(job, rules, attained or {}, now), job.id)
    if rules.discipline == "fairshare":
        share = usage.get(job.user, 0.0) / rules.user_weights.get(job.user, 1.0)
        return (-job.priority, share, job.id)
    if rules.discipline == "sjf":
        return (
            -job.priority,
            job.time_limit_s if job.time_limit_s is not None else math.inf,
            job.id,
        )
    return (-job.priority, job.id)


def fair_share(rules: QueueRules, usage: Mapping[str, float]) -> Callable[[str], float] | None:
    """Each user's share, by which fairshare merges the users' lines (order_key's); None
    under the other disciplines."""
    if rules.discipline != "fairshare":
        return None
    return lambda user: usage.get(user, 0.0) / rules.user_weights.get(user, 1.0)


def queue_order(
    pending: Sequence[Job],
    rules: QueueRules,
    usage: Mapping[str, float],
    now: float = 0.0,
    attained: Mapping[int, float] | None = None,
) -> list[Job]:
    """The jobs in the order a pass considers them (order_key's)."""
    if rules.discipline in ("fairshare", "sjf", "las"):
        return sorted(pending, key=lambda j: order_key(j, rules, usage, now, attained))
    # The plain (-priority, id) order as two sorts on attributes, with no Python call
    # per job: every pass sorts the whole queue, and a queue may hold thousands. The
    # second sort is stable, reverse=True included, so ids stay in order within a priority.
    ordered = sorted(pending, key=attrgetter("id"))
    ordered.sort(key=attrgetter("priority"), reverse=True)
    return ordered


def decay_usage(
    usage: Mapping[str, float], running: Sequence[Job], elapsed_s: float, half_life_s: float
) -> dict[str, float]:
    """Fair-share usage in GPU-seconds: old usage halves every half-life, running jobs add
    their GPUs for the whole time (the simulator's step, from one event to the next)."""
    return add_usage(
        usage,
        ((job.user, max(job.request.gpus, 0) * elapsed_s) for job in running),
        elapsed_s,
        half_life_s,
    )


def add_usage(
    usage: Mapping[str, float],
    gpu_seconds: Iterable[tuple[str, float]],
    elapsed_s: float,
    half_life_s: float,
) -> dict[str, float]:
    """Fair-share usage after elapsed_s: the old halves every half-life, then each
    (user, GPU-seconds) used meanwhile is added."""
    factor = 0.5 ** (elapsed_s / half_life_s) if half_life_s > 0 else 0.0
    out = {user: value * factor for user, value in usage.items() if value * factor > 1e-3}
    for user, seconds in gpu_seconds:
        out[user] = out.get(user, 0.0) + seconds
    return out


def run_gpu_seconds(job: Job, since: float, until: float) -> float:
    """The GPU-seconds a run used from `since` (or its start, if later) to `until`.
    Negative when `until` comes first: it takes back what was counted for a run that had
    already ended (its end was noticed later than it happened)."""
    start = since if job.started_at is None else max(job.started_at, since)
    return max(job.request.gpus, 0) * (until - start)
