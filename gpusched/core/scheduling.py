"""Pure scheduling: which pending jobs may start, in what order, and why the others wait.

The daemon and the trace simulator both call `schedule`, so the simulator measures the
very decisions the daemon makes.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_right
from dataclasses import dataclass, field, replace
from operator import attrgetter, itemgetter
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from gpusched.core import lifecycle, placement
# Here for the daemon's callers: what dependencies decide lives in core/dependencies.py.
from gpusched.core.dependencies import DependencyStates, dependency_status  # noqa: F401
# DISCIPLINES, the names QueueRules.discipline takes, lives in models for the command line.
from gpusched.core.models import DISCIPLINES, GpuInfo, Inventory, Job, JobState, Request
from gpusched.core.pendingqueue import Bound, PendingQueue, Walk
from gpusched.core.placement import GpuLoad, PlacementRules


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
    discipline: str = DISCIPLINES[0]
    user_weights: Mapping[str, float] = field(default_factory=dict)
    max_gpus_per_user: int | None = None
    max_running_per_user: int | None = None
    draining: bool = False
    host: HostCapacity | None = None  # None: host resources are not counted (the simulator)


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


def order_key(job: Job, rules: QueueRules, usage: Mapping[str, float]):
    if rules.discipline == "fairshare":
        share = usage.get(job.user, 0.0) / rules.user_weights.get(job.user, 1.0)
        return (-job.priority, share, job.id)
    if rules.discipline == "sjf":
        return (-job.priority, job.time_limit_s if job.time_limit_s is not None else math.inf, job.id)
    return (-job.priority, job.id)


def fair_share(rules: QueueRules,
               usage: Mapping[str, float]) -> Callable[[str], float] | None:
    """Each user's share, by which fairshare merges the users' lines (order_key's); None
    under the other disciplines."""
    if rules.discipline != "fairshare":
        return None
    return lambda user: usage.get(user, 0.0) / rules.user_weights.get(user, 1.0)


def queue_order(pending: Sequence[Job], rules: QueueRules,
                usage: Mapping[str, float]) -> list[Job]:
    """The jobs in the order a pass considers them (order_key's)."""
    if rules.discipline in ("fairshare", "sjf"):
        return sorted(pending, key=lambda j: order_key(j, rules, usage))
    # The plain (-priority, id) order as two sorts on attributes, with no Python call
    # per job: every pass sorts the whole queue, and a queue may hold thousands. The
    # second sort is stable, reverse=True included, so ids stay in order within a priority.
    ordered = sorted(pending, key=attrgetter("id"))
    ordered.sort(key=attrgetter("priority"), reverse=True)
    return ordered


def decay_usage(usage: Mapping[str, float], running: Sequence[Job], elapsed_s: float,
                half_life_s: float) -> dict[str, float]:
    """Fair-share usage in GPU-seconds: old usage halves every half-life, running jobs add
    their GPUs for the whole time (the simulator's step, from one event to the next)."""
    return add_usage(usage, ((job.user, max(job.request.gpus, 0) * elapsed_s)
                             for job in running), elapsed_s, half_life_s)


def add_usage(usage: Mapping[str, float], gpu_seconds: Iterable[tuple[str, float]],
              elapsed_s: float, half_life_s: float) -> dict[str, float]:
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


@dataclass
class _Pass:
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


def _expected_end(job: Job, now: float) -> float:
    if job.time_limit_s is None:
        return math.inf
    return (job.started_at if job.started_at is not None else now) + job.time_limit_s


def _new_pass(running: Sequence[Job], loads: Mapping[str, GpuLoad],
              placements: Mapping[int, int], now: float) -> _Pass:
    p = _Pass(dict(loads), dict(placements), {}, {}, {}, {})
    for job in running:
        _count(p, job, job.gpu_uuids, now)
    return p


def _count(p: _Pass, job: Job, uuids: Sequence[str], now: float) -> None:
    p.cpus_used += job.request.cpus
    p.mem_used_bytes += job.request.mem_bytes or 0
    p.running += 1
    p.user_gpus[job.user] = p.user_gpus.get(job.user, 0) + job.request.gpus
    p.user_jobs[job.user] = p.user_jobs.get(job.user, 0) + 1
    if job.array_id is not None:
        p.array_running[job.array_id] = p.array_running.get(job.array_id, 0) + 1
    end = _expected_end(job, now)
    for uuid in uuids:
        p.ends[uuid] = max(p.ends.get(uuid, now), end)


def held_reason(job_id: int) -> str:
    """Why a held job waits: also set when it is queued, so that the first pass over
    100,000 held elements has no reason to change."""
    return f"held (`gpusched release {job_id}` lets it start)"


def _limit_reason(job: Job, p: _Pass, rules: QueueRules) -> str:
    if rules.draining:
        return "the queue is draining (`gpusched resume` starts jobs again)"
    if job.held:
        return held_reason(job.id)
    if job.array_id is not None and job.array_throttle is not None and \
            p.array_running.get(job.array_id, 0) >= job.array_throttle:
        return f"array {job.array_id} already runs {job.array_throttle} at once (%{job.array_throttle})"
    if rules.max_running_per_user is not None and \
            p.user_jobs.get(job.user, 0) >= rules.max_running_per_user:
        return f"{job.user} already runs {rules.max_running_per_user} jobs (max_running_per_user)"
    if rules.max_gpus_per_user is not None and \
            p.user_gpus.get(job.user, 0) + job.request.gpus > rules.max_gpus_per_user:
        return (f"{job.user} would hold more than {rules.max_gpus_per_user} GPUs "
                f"(max_gpus_per_user; holds {p.user_gpus.get(job.user, 0)})")
    return _host_reason(job, p, rules.host) if rules.host else ""


def _box_is_full(p: _Pass, queue: QueueRules) -> bool:
    """Whether max_running is reached, so that no job of any kind can start."""
    host = queue.host
    return (host is not None and host.max_running is not None and p.running >= host.max_running
            and not queue.draining)


def _host_reason(job: Job, p: _Pass, host: HostCapacity) -> str:
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
        return (f"needs {mem / 2**30:.1f} GiB of host memory; {free / 2**30:.1f} of "
                f"{host.mem_bytes / 2**30:.1f} GiB free")
    return ""


def _reserve(job: Job, p: _Pass, rules: PlacementRules, now: float) -> None:
    """EASY backfill: the first blocked job is promised the soonest time enough GPUs free up."""
    allowed = [l for l in p.loads.values()
               if l.gpu.is_healthy and job.request.constraints.allows(l.gpu)]
    if len(allowed) < job.request.gpus:
        return
    ends = sorted(p.ends.get(l.gpu.uuid, now) for l in allowed)
    start = ends[job.request.gpus - 1]
    p.reservation = (start, frozenset(l.gpu.uuid for l in allowed), job.request.gpus, job.id)


def _delays_reservation(job: Job, gpus: Sequence[GpuInfo], p: _Pass, now: float) -> bool:
    """Whether the reserved job would find too few GPUs free at its reserved start.

    A job that ends by then never delays it; a longer one may still take the GPUs that
    will be spare at that time (EASY's "extra nodes"), not only ones it will never want.
    """
    if p.reservation is None:
        return False
    start, allowed, need, _ = p.reservation
    if _expected_end(job, now) <= start:
        return False
    taken = {g.uuid for g in gpus}
    free_at_start = sum(1 for uuid in allowed
                        if uuid not in taken and p.ends.get(uuid, now) <= start)
    return free_at_start < need


def _choose(job: Job, p: _Pass, rules: PlacementRules, unplaceable: set[tuple],
            held: Mapping[str, int] | None = None) -> tuple[GpuInfo, ...] | None:
    """The GPUs for a job now, or None when it does not fit.

    Loads only fill up during a pass, so a request that found too few GPUs once finds too
    few again: remember it, and a long queue of alike jobs costs one search, not one each.
    Only built-in policies qualify: a custom one may veto GPUs by placement counts.
    `held`: GPUs kept for a job that preempted others (uuid -> its id): no other job gets them.
    """
    if not job.request.gpus:
        return ()
    holder = job.id if held and job.id in held.values() else None
    key = (job.request, job.policy or rules.policy, holder)
    if key in unplaceable:
        return None
    if held:
        loads = {uuid: load for uuid, load in p.loads.items() if held.get(uuid, job.id) == job.id}
    elif _usable_gpus(p) < job.request.gpus:
        loads = None  # too few for any policy: choose_gpus needs that many that fit
    else:
        loads = p.loads
    chosen = None if loads is None else placement.choose_gpus(
        job.request, loads, rules, p.placements, job.policy, p.links)
    if chosen is None and key[1] in placement.BUILTIN_POLICIES:
        unplaceable.add(key)
    return chosen


def _usable_gpus(p: _Pass) -> int:
    """How many GPUs could take a job now, at most: a pass asks it of each shape it
    weighs, and it changes only when a job starts."""
    if p.usable_gpus < 0:
        p.usable_gpus = sum(1 for load in p.loads.values() if placement.is_usable(load))
    return p.usable_gpus


def _gpu_reason(request: Request, p: _Pass, inventory: Inventory, rules: PlacementRules,
                known: dict[Request, str]) -> str:
    """placement.pending_reason, worked out once per request until the loads change: a
    long queue of alike jobs on a full box is asked after every end, one job at a time."""
    why = known.get(request)
    if why is None:
        why = known[request] = placement.pending_reason(request, p.loads, inventory, rules)
    return why


def _waits_on_dependencies(job: Job, dep_states: Mapping[int, JobState],
                           reasons: dict[int, str], cancels: dict[int, str]) -> bool:
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
    if not job.held and not job.dependencies and job.eligible_at is None:  # the common case
        w.reasons[job.id] = full_reason
    elif lifecycle.is_waiting_to_retry(job, w.now):
        w.reasons[job.id] = lifecycle.retry_reason(job, w.now)
    elif not _waits_on_dependencies(job, w.deps, w.reasons, w.cancels):
        w.reasons[job.id] = held_reason(job.id) if job.held else full_reason


@dataclass
class _Walk:
    """One pass's decisions so far, besides the counts in its _Pass."""

    p: _Pass
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
    unplaceable: set[tuple] = field(default_factory=set)
    gpu_reasons: dict[Request, str] = field(default_factory=dict)  # why the GPUs cannot take it now
    first_blocked: int | None = None  # the first job in line that the GPUs cannot take
    # Where the pass skips refused jobs unseen (pendingqueue.Walk): each start's place in
    # line and the counts just before it, to explain a skipped job as of its place.
    marks: list[tuple[tuple, _Pass, set[tuple], dict[Request, str]]] | None = None


# _consider's verdicts: start it; it cannot start this pass, nor can any job of its shape
# (core/pendingqueue.Bound); it does not start, but others of its shape might.
START, BLOCKED, OPEN = range(3)


def _consider(job: Job, w: _Walk) -> tuple[int, tuple[GpuInfo, ...] | None]:
    """Whether the job starts now (with its GPUs), else why not, noted in w.reasons."""
    p, now = w.p, w.now
    if job.eligible_at is not None and lifecycle.is_waiting_to_retry(job, now):
        w.reasons[job.id] = lifecycle.retry_reason(job, now)
        return BLOCKED, None
    if _waits_on_dependencies(job, w.deps, w.reasons, w.cancels):
        return (OPEN if job.id in w.cancels else BLOCKED), None
    why = _limit_reason(job, p, w.queue)
    if why:
        w.reasons[job.id] = why
        return BLOCKED, None
    chosen = _choose(job, p, w.rules, w.unplaceable, w.held) \
        if w.free_any or not job.request.gpus else None
    if chosen is not None and _delays_reservation(job, chosen, p, now):
        if w.explain:
            w.reasons[job.id] = (f"backfill: would delay job {p.reservation[-1]}, which is "
                                 "first in line")
        return OPEN, None  # a shorter job of its shape may fit before the reserved start
    if chosen is not None:
        return START, chosen
    if w.queue.discipline == "backfill" and p.reservation is None:
        _reserve(job, p, w.rules, now)
    if w.explain:
        why = _gpu_reason(job.request, p, w.inventory, w.rules, w.gpu_reasons)
        # As Slurm's Resources and Priority: the next in line waits for GPUs, the
        # others wait behind it (a job that fits still starts ahead of it).
        w.reasons[job.id] = why if w.first_blocked is None else \
            f"behind job {w.first_blocked}, which is next in line; {why}"
    if w.first_blocked is None:
        w.first_blocked = job.id
    # A custom policy may veto GPUs by placement counts, which change as jobs start.
    sure = not w.free_any or (job.policy or w.rules.policy) in placement.BUILTIN_POLICIES
    return (BLOCKED if sure else OPEN), None


def _start(job: Job, chosen: tuple[GpuInfo, ...], w: _Walk) -> None:
    w.gpu_reasons.clear()  # the loads change: reasons worked out before may not hold
    placement.take(w.p.loads, job, chosen)
    w.p.usable_gpus = -1
    for gpu in chosen:
        w.p.placements[gpu.index] = w.p.placements.get(gpu.index, 0) + 1
    _count(w.p, job, [g.uuid for g in chosen], w.now)


def _look_at_cancels(rest: Iterator[Job], bound: Bound, w: _Walk, full_reason: str,
                     seen: list[int]) -> None:
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


def _counts_now(p: _Pass) -> _Pass:
    """A copy of the pass's counts, which a start changes in place."""
    return replace(p, loads=dict(p.loads), placements=dict(p.placements),
                   user_gpus=dict(p.user_gpus), user_jobs=dict(p.user_jobs),
                   array_running=dict(p.array_running), ends=dict(p.ends))


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


def _explainer(w: _Walk, seen: set[int],
               usage: Mapping[str, float]) -> Callable[[Job], str | None]:
    """The reason a pending job the pass stopped before, or skipped, would have been given,
    worked out when asked (`show`, `ls`): the counts it is weighed against are those the
    whole walk had at its place (_as_of), so the answer is the one the whole walk would
    have written. None for a job the pass looked at: its own reason is stored."""

    def explain(job: Job) -> str | None:
        if job.id in seen or job.state is not JobState.PENDING:
            return None
        scratch = _as_of(job, w, usage)
        if _box_is_full(scratch.p, w.queue):
            _full_box_reason(job, scratch, _host_reason(job, scratch.p, w.queue.host))
        elif _consider(job, scratch)[0] == START:
            return None  # new since the pass: the next one decides
        return scratch.reasons.get(job.id) or scratch.cancels.get(job.id)
    return explain


def schedule(pending: Iterable[Job], running: Sequence[Job], loads: Mapping[str, GpuLoad],
             inventory: Inventory, rules: PlacementRules, queue: QueueRules, now: float,
             dep_states: Mapping[int, JobState] | None = None,
             usage: Mapping[str, float] | None = None,
             placements: Mapping[int, int] | None = None, explain: bool = True,
             held: Mapping[str, int] | None = None,
             line: PendingQueue | None = None) -> Plan:
    """One pass over the queue: every job that may start and fits starts, in order.

    A job that does not fit never blocks the ones behind it (skip-ahead), except under
    backfill, where they may not push back the first blocked job's reserved start.
    `explain=False` skips building reasons (the simulator replays thousands of passes).
    `held`: GPUs kept for jobs that preempted others (core/preemption.held_gpus).
    `line`: the queue `pending` comes from, in its order (core/pendingqueue.py), which
    counts its jobs' shapes: the pass stops once no job left can start (docs/scheduling.md,
    "How a pass is bounded"), and Plan.later explains the rest.
    """
    p = _new_pass(running, loads, placements or {}, now)
    p.links = inventory.links
    deps = {} if dep_states is None else dep_states  # a lookup filled on demand starts empty
    w = _Walk(p, rules, queue, inventory, now, deps, held, explain,
              any(placement.is_usable(l) for l in p.loads.values()))
    walk = pending if isinstance(pending, Walk) else None
    bound = Bound(line, walk) if line is not None else None
    if walk is not None and explain:
        w.marks = []
    ordered = iter(pending if bound else queue_order(list(pending), queue, usage or {}))
    starts: list[tuple[int, tuple[GpuInfo, ...]]] = []
    seen: list[int] = []
    for job in ordered:
        if _box_is_full(p, queue):
            # Nothing more can start this pass: the rest share one reason (a long queue
            # behind max_running is the common case, and it is checked after every end).
            full_reason = _host_reason(job, p, queue.host)
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
        if verdict == START:
            if w.marks is not None:
                w.marks.append((order_key(job, queue, usage or {}), _counts_now(p), set(), {}))
            _start(job, chosen, w)
            starts.append((job.id, chosen))
        elif bound and verdict == BLOCKED:
            bound.block(shape)
        if bound and bound.is_done():
            break
    later = _explainer(w, set(seen), usage or {}) if bound and explain else None
    return Plan(tuple(starts), w.reasons, w.cancels, p.placements, len(seen), later)
