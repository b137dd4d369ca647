"""Pure scheduling: which pending jobs may start, in what order, and why the others wait.

The daemon and the trace simulator both call `schedule`, so the simulator measures the
very decisions the daemon makes.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import itemgetter

from gpusched.core import lifecycle
from gpusched.core.models import GpuInfo, Inventory, Job, JobState, Request
from gpusched.core.sched import placement, quotas

# Here for the daemon's callers: what dependencies decide lives in core/sched/dependencies.py.
from gpusched.core.sched.dependencies import DependencyStates, dependency_status  # noqa: F401
from gpusched.core.sched.passcounts import (
    PassCounts,
    Unplaceable,
    counts_now,
    delays_reservation,
    gpus_for,
    job_gpu_mem,
    new_pass,
    reserve,
    take,
)
from gpusched.core.sched.pendingqueue import Bound, PendingQueue, Walk
from gpusched.core.sched.placement import GpuLoad, PlacementRules
from gpusched.core.sched.queuerules import (
    HostCapacity,
    QueueRules,
    las_label,
    las_queue,
    order_key,
    queue_order,
)
from gpusched.core.sched.quotas import Limit


@dataclass(frozen=True)
class Plan:
    starts: tuple[tuple[int, tuple[GpuInfo, ...]], ...] = ()
    reasons: Mapping[int, str] = field(default_factory=dict)
    cancels: Mapping[int, str] = field(default_factory=dict)  # never-satisfiable dependencies
    # GPU index -> jobs placed on it, this pass's starts included: the round-robin
    # counter to pass to the next pass once the starts are made.
    placements: Mapping[int, int] = field(default_factory=dict)
    considered: int = 0  # jobs the pass looked at: bounded, not the queue's length
    # A bounded pass's reasons for the jobs it stopped before (schedule's `shapes`).
    later: Callable[[Job], str | None] | None = None


def held_reason(job_id: int) -> str:
    """Why a held job waits: also set when it is queued, so that the first pass over
    100,000 held elements has no reason to change."""
    return f"held (`gpusched release {job_id}` lets it start)"


def _user_limits(user: str, p: PassCounts, rules: QueueRules, now: float) -> dict[str, Limit]:
    found = p.user_limits.get(user)
    if found is None:
        groups = rules.groups_of(user)
        found = quotas.limits_for(rules.quotas, user, groups, rules.minute_of(now))
        p.user_limits[user] = found
    return found


def _mem_quota_reason(job: Job, chosen: Sequence[GpuInfo], p: PassCounts, rules: QueueRules) -> str:
    """Why the job waits for its user's max_gpu_mem on the GPUs placement chose ("": not)."""
    limits = p.user_limits.get(job.user, {})  # _limit_reason looked them up
    if "max_gpu_mem" not in limits:
        return ""
    mem = job_gpu_mem(job, [g.uuid for g in chosen], p.loads)
    return quotas.mem_reason(job.user, limits, mem, p.user_gpu_mem.get(job.user, 0))


def quota_reason(job: Job, p: PassCounts, rules: QueueRules, now: float) -> str:
    """Why the job's user's quotas on running jobs and GPUs keep it waiting ("": they do not)."""
    if not rules.quotas:
        return ""
    limits = _user_limits(job.user, p, rules, now)
    used = (p.user_jobs.get(job.user, 0), p.user_gpus.get(job.user, 0), 0)
    return quotas.running_reason(job.user, limits, job.request.gpus, used)


def _limit_reason(job: Job, p: PassCounts, rules: QueueRules, now: float) -> str:
    # A hold first: a held job stays put after `resume` too, and only `release` starts it.
    if job.held:
        return held_reason(job.id)
    if rules.draining:
        return "the queue is draining (`gpusched resume` starts jobs again)"
    if (
        job.array_id is not None
        and job.array_throttle is not None
        and p.array_running.get(job.array_id, 0) >= job.array_throttle
    ):
        return f"array {job.array_id} already runs {job.array_throttle} at once (%{job.array_throttle})"
    why = quota_reason(job, p, rules, now)
    if why:
        return why
    return _host_reason(job, p, rules.host) if rules.host else ""


def _full_host(p: PassCounts, queue: QueueRules) -> HostCapacity | None:
    """The host when its max_running is reached, so that no job of any kind can start;
    else None."""
    host = queue.host
    if (
        host is not None
        and host.max_running is not None
        and p.running >= host.max_running
        and not queue.draining
    ):
        return host
    return None


def _host_reason(job: Job, p: PassCounts, host: HostCapacity) -> str:
    """Why the host's cores, memory or running-job limit keep the job waiting."""
    if host.max_running is not None and p.running >= host.max_running:
        return f"{p.running} jobs are running (max_running = {host.max_running})"
    # Below zero when jobs that do not wait for cores hold more than the box has.
    free_cpus = max(host.cpus - p.cpus_used, 0)
    if job.request.cpus_required and job.request.cpus > free_cpus:
        plural = "s" if job.request.cpus != 1 else ""
        return f"needs {job.request.cpus} CPU{plural}; {free_cpus} of {host.cpus} free"
    mem = job.request.mem_bytes
    if mem is not None and mem > host.mem_bytes - p.mem_used_bytes:
        free = max(host.mem_bytes - p.mem_used_bytes, 0)
        return (
            f"needs {mem / 2**30:.1f} GiB of host memory; {free / 2**30:.1f} of "
            f"{host.mem_bytes / 2**30:.1f} GiB free"
        )
    return ""


# Why the GPUs cannot take a request, under a policy ("": the rules'), in this pass so far.
GpuReasons = dict[tuple[Request, str], str]


def _gpu_reason(
    job: Job, p: PassCounts, inventory: Inventory, rules: PlacementRules, known: GpuReasons
) -> str:
    """placement.pending_reason, worked out once per request and policy until the loads
    change: a long queue of alike jobs on a full box is asked after every end, one job at
    a time."""
    key = (job.request, job.policy)
    why = known.get(key)
    if why is None:
        why = known[key] = placement.pending_reason(
            job.request, p.loads, inventory, rules, job.policy, p.placements
        )
    return why


def _waits_on_dependencies(
    job: Job, dep_states: Mapping[int, JobState], reasons: dict[int, str], cancels: dict[int, str]
) -> bool:
    """Whether the job's dependencies keep it from starting (noting why, or cancelling
    it when they never can be met and it asked for that)."""
    if not job.dependencies:
        return False
    never, why = dependency_status(job, dep_states)
    if never and job.kill_on_invalid_dep:
        cancels[job.id] = why
        return True
    if why:
        reasons[job.id] = why
    return bool(why)


def _full_box_reason(job: Job, w: _Walk, full_reason: str) -> None:
    """A job's reason once max_running is reached: one shared reason, but a job's own
    dependencies (and a hold) still come first, as in _consider."""
    if (
        not job.held and not job.dependencies and job.eligible_at is None and job.begin_time is None
    ):  # the common case
        w.reasons[job.id] = full_reason
    elif lifecycle.is_waiting_to_retry(job, w.now):
        w.reasons[job.id] = lifecycle.retry_reason(job, w.now)
    elif lifecycle.waits_to_begin(job, w.now):
        w.reasons[job.id] = lifecycle.begin_reason(job)
    elif not _waits_on_dependencies(job, w.deps, w.reasons, w.cancels):
        w.reasons[job.id] = held_reason(job.id) if job.held else full_reason


@dataclass
class _Walk:
    """One pass's decisions so far, besides the counts in its PassCounts."""

    p: PassCounts
    rules: PlacementRules
    queue: QueueRules
    inventory: Inventory
    now: float
    deps: Mapping[int, JobState]
    held: Mapping[str, int] | None
    explain: bool
    # With every GPU held whole, no GPU job can start: skip the per-job search (the
    # simulator's common case on a full box). Placing jobs only ever takes GPUs away.
    free_any: bool
    reasons: dict[int, str] = field(default_factory=dict)
    cancels: dict[int, str] = field(default_factory=dict)
    unplaceable: set[Unplaceable] = field(default_factory=set)
    # Why the GPUs cannot take a request (under a policy) now.
    gpu_reasons: GpuReasons = field(default_factory=dict)
    first_blocked: int | None = None  # the first job in line that the GPUs cannot take
    # Where the pass skips refused jobs unseen (pendingqueue.Walk): each start's place in
    # line and the counts just before it, to explain a skipped job as of its place.
    marks: list[tuple[tuple[float, ...], PassCounts, set[Unplaceable], GpuReasons]] | None = None


# _consider's verdicts: start it; it cannot start this pass, nor can any job of its shape
# (core/pendingqueue.Bound); it does not start, but others of its shape might.
START, BLOCKED, OPEN = range(3)


def _consider(job: Job, w: _Walk) -> tuple[int, tuple[GpuInfo, ...] | None]:
    """Whether the job starts now (with its GPUs), else why not, noted in w.reasons."""
    p, now = w.p, w.now
    if job.eligible_at is not None and lifecycle.is_waiting_to_retry(job, now):
        w.reasons[job.id] = lifecycle.retry_reason(job, now)
        return BLOCKED, None
    if job.begin_time is not None and lifecycle.waits_to_begin(job, now):
        w.reasons[job.id] = lifecycle.begin_reason(job)
        return BLOCKED, None
    if _waits_on_dependencies(job, w.deps, w.reasons, w.cancels):
        return (OPEN if job.id in w.cancels else BLOCKED), None
    why = _limit_reason(job, p, w.queue, now)
    if why:
        w.reasons[job.id] = why
        return BLOCKED, None
    chosen = (
        gpus_for(job, p, w.rules, w.unplaceable, w.held)
        if w.free_any or not job.request.gpus
        else None
    )
    if chosen and w.queue.quotas and (why := _mem_quota_reason(job, chosen, p, w.queue)):
        w.reasons[job.id] = why
        return OPEN, None  # smaller GPUs may still fit under the quota
    if chosen is not None and delays_reservation(job, chosen, p, now):
        if w.explain and p.reservation is not None:  # it is: the job would delay it
            w.reasons[job.id] = f"would delay job {p.reservation[-1]}'s reserved start (backfill)"
        return OPEN, None  # a shorter job of its shape may fit before the reserved start
    if chosen is not None:
        return START, chosen
    if w.queue.discipline == "backfill" and p.reservation is None:
        reserve(job, p, w.rules, now)
    vetoed = False
    if w.explain:
        why = _gpu_reason(job, p, w.inventory, w.rules, w.gpu_reasons)
        # As Slurm's Resources and Priority: the next in line waits for GPUs, the
        # others wait behind it (a job that fits still starts ahead of it). A job its
        # policy turned down waits for its policy, not behind another, nor others behind it.
        vetoed = why.startswith(placement.POLICY_REFUSAL)
        w.reasons[job.id] = (
            why
            if w.first_blocked is None or vetoed
            else f"behind job {w.first_blocked}, which is next in line; {why}"
        )
    if w.first_blocked is None and not vetoed:
        w.first_blocked = job.id
    # A custom policy may veto GPUs by placement counts, which change as jobs start.
    sure = not w.free_any or (job.policy or w.rules.policy) in placement.BUILTIN_POLICIES
    return (BLOCKED if sure else OPEN), None


def _start(job: Job, chosen: tuple[GpuInfo, ...], w: _Walk) -> None:
    w.gpu_reasons.clear()  # the loads change: reasons worked out before may not hold
    take(w.p, job, chosen, w.now)


def _look_at_cancels(
    rest: Iterator[Job], bound: Bound, w: _Walk, full_reason: str, seen: list[int]
) -> None:
    """With max_running reached, a bounded pass still looks at the jobs that it may have
    to cancel (a dependency never met), and only while such jobs are ahead: every other
    shape is blocked, so that the walk passes over their jobs."""
    bound.block_all_but_cancels()
    for job in rest:
        if bound.is_done():
            return
        shape = bound.take(job)
        if shape not in bound.blocked:
            seen.append(job.id)
            _full_box_reason(job, w, full_reason)
            if job.id not in w.cancels:
                bound.block(shape)


def _as_of(job: Job, w: _Walk, usage: Mapping[str, float]) -> _Walk:
    """A scratch copy of the pass as it stood when it came to the job's place in line: its
    final state, or (for a job it skipped, pendingqueue.Walk) the counts before the first
    start behind it. Its caches (unplaceable, gpu_reasons) are those of that state."""
    scratch = replace(w, reasons={}, cancels={})
    if w.marks:
        at = bisect_right(w.marks, order_key(job, w.queue, usage), key=itemgetter(0))
        if at < len(w.marks):
            scratch.p, scratch.unplaceable, scratch.gpu_reasons = w.marks[at][1:]
    scratch.p = replace(scratch.p)  # _consider may note backfill's reservation on it
    return scratch


def _explainer(w: _Walk, seen: set[int], usage: Mapping[str, float]) -> Callable[[Job], str | None]:
    """The reason a pending job the pass stopped before, or skipped, would have been given,
    worked out when asked (`show`, `ls`): the counts it is weighed against are those the
    whole walk had at its place (_as_of), so the answer is the one the whole walk would
    have written. None for a job the pass looked at: its own reason is stored."""

    def explain(job: Job) -> str | None:
        if job.id in seen or job.state is not JobState.PENDING:
            return None
        scratch = _as_of(job, w, usage)
        if (host := _full_host(scratch.p, w.queue)) is not None:
            _full_box_reason(job, scratch, _host_reason(job, scratch.p, host))
        elif _consider(job, scratch)[0] == START:
            return None  # new since the pass: the next one decides
        return scratch.reasons.get(job.id) or scratch.cancels.get(job.id)

    return explain


def schedule(
    pending: Iterable[Job],
    running: Sequence[Job],
    loads: Mapping[str, GpuLoad],
    inventory: Inventory,
    rules: PlacementRules,
    queue: QueueRules,
    now: float,
    dep_states: Mapping[int, JobState] | None = None,
    usage: Mapping[str, float] | None = None,
    placements: Mapping[int, int] | None = None,
    explain: bool = True,
    held: Mapping[str, int] | None = None,
    line: PendingQueue | None = None,
    attained: Mapping[int, float] | None = None,
) -> Plan:
    """One pass over the queue: every job that may start and fits starts, in order.

    A job that does not fit never blocks the ones behind it (skip-ahead), except under
    backfill, where they may not push back the first blocked job's reserved start.
    `explain=False` skips building reasons (the simulator replays thousands of passes).
    `held`: GPUs kept for jobs that preempted others (core/preemption.held_gpus).
    `line`: the queue `pending` comes from, in its order (core/sched/pendingqueue.py), which
    counts its jobs' shapes: the pass stops once no job left can start (docs/scheduling.md,
    "How a pass is bounded"), and Plan.later explains the rest; not under las, whose
    order moves with time. `attained`: GPU-seconds of each job's earlier runs (las).
    """
    p = new_pass(running, loads, placements or {}, now)
    p.links = inventory.links
    deps = {} if dep_states is None else dep_states  # a lookup filled on demand starts empty
    w = _Walk(
        p,
        rules,
        queue,
        inventory,
        now,
        deps,
        held,
        explain,
        any(placement.is_usable(load) for load in p.loads.values()),
    )
    walk = pending if isinstance(pending, Walk) else None
    bound = Bound(line, walk) if line is not None else None
    if walk is not None and explain:
        w.marks = []
    in_order = [] if bound else queue_order(list(pending), queue, usage or {}, now, attained)
    ordered = iter(pending if bound else in_order)
    starts: list[tuple[int, tuple[GpuInfo, ...]]] = []
    seen: list[int] = []
    for job in ordered:
        if (host := _full_host(p, queue)) is not None:
            # Nothing more can start this pass: the rest share one reason (a long queue
            # behind max_running is the common case, and it is checked after every end).
            full_reason = _host_reason(job, p, host)
            rest = itertools.chain((job,), ordered)
            if bound is None:
                for each in rest:
                    _full_box_reason(each, w, full_reason)
            else:
                _look_at_cancels(rest, bound, w, full_reason, seen)
            break
        shape = bound.take(job) if bound else None
        if not explain and bound and shape in bound.blocked:
            continue  # refused alike (Bound), and no reason to write
        seen.append(job.id)
        verdict, chosen = _consider(job, w)
        if verdict == START and chosen is not None:  # START always comes with the GPUs
            if w.marks is not None:
                w.marks.append((order_key(job, queue, usage or {}), counts_now(p), set(), {}))
            _start(job, chosen, w)
            starts.append((job.id, chosen))
        elif bound and verdict == BLOCKED and shape is not None:  # shape: bound's
            bound.block(shape)
        if bound and bound.is_done():
            break
    later = _explainer(w, set(seen), usage or {}) if bound and explain else None
    if queue.discipline == "las" and explain and bound is None:
        _name_las_queues(in_order, w.reasons, queue, attained or {}, now)
    return Plan(tuple(starts), w.reasons, w.cancels, p.placements, len(seen), later)


def _name_las_queues(
    jobs: Sequence[Job],
    reasons: dict[int, str],
    queue: QueueRules,
    attained: Mapping[int, float],
    now: float,
) -> None:
    """Each waiting job's reason, led by its las queue (a hold or a dependency too: the
    queue says where it will stand once free)."""
    for job in jobs:
        why = reasons.get(job.id)
        if why:
            reasons[job.id] = f"{las_label(las_queue(job, queue, attained, now), queue)}; {why}"
