"""Trace simulator: replays jobs in simulated time through the daemon's own scheduling code."""

from __future__ import annotations

import heapq
import itertools
import math
import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpusched.core import lifecycle
from gpusched.core.config import Settings
from gpusched.core.errors import GpuschedError, UsageError
from gpusched.core.models import DISCIPLINES, GpuInfo, Inventory, Job, Request
from gpusched.core.sched import placement, queuerules, quotas, reservations, scheduling
from gpusched.core.sched.memestimate import percentile
from gpusched.core.sched.pendingqueue import PendingQueue
from gpusched.core.sched.placement import PlacementRules, Policy
from gpusched.core.sched.policies import load_custom_policies, placement_rules
from gpusched.core.sched.queuerules import HostCapacity, QueueRules, fair_share
from gpusched.core.sched.reservations import Reservation
from gpusched.core.users import unix_groups
from gpusched.sim import traces

GPU_MEM_BYTES = 80 * 2**30  # each simulated GPU: an 80 GiB card, idle, nothing outside
TAU_S = 10.0  # bounded slowdown ignores how short jobs shorter than this are
DEFAULT_HALF_LIFE_S = traces.DAY_S  # fair-share usage halves every day


@dataclass(frozen=True)
class JobResult:
    job_id: str
    tenant: str
    num_gpus: int
    duration_s: float
    submit_s: float
    start_s: float
    end_s: float
    gpu_indices: tuple[int, ...] = ()  # where it ran; empty when not known

    @property
    def jct_s(self) -> float:
        return self.end_s - self.submit_s

    @property
    def wait_s(self) -> float:
        return self.start_s - self.submit_s

    @property
    def bounded_slowdown(self) -> float:
        return max(1.0, self.jct_s / max(self.duration_s, TAU_S))


@dataclass(frozen=True)
class Metrics:
    jobs: int
    tenants: int
    avg_jct_s: float
    median_jct_s: float
    p99_jct_s: float
    avg_wait_s: float
    avg_bounded_slowdown: float
    makespan_s: float
    gpu_utilization: float
    jain_fairness: float


def simulated_box(gpus: int, links: Sequence[Sequence[str]] = ()) -> Inventory:
    """`gpus` alike GPUs; with `links` (core/sched/topology.py), placed by their connectivity."""
    return Inventory(
        tuple(
            GpuInfo(
                index=i,
                uuid=f"GPU-sim-{i}",
                name="Simulated 80GB",
                mem_total_bytes=GPU_MEM_BYTES,
                mem_used_bytes=0,
                util_pct=0.0,
            )
            for i in range(gpus)
        ),
        links=tuple(tuple(row) for row in links),
    )


def _as_jobs(trace_jobs: Sequence[traces.TraceJob]) -> list[Job]:
    # Job ids follow submission order, as the daemon's do: FIFO and every tie-break
    # below "priority" in queuerules.order_key rely on it. The time limit is the true
    # duration (exact estimates): backfill reserves with it, and sjf becomes the oracle.
    return [
        Job(
            id=n,
            command=(),
            cwd="",
            uid=0,
            user=t.tenant,
            request=Request(
                gpus=t.num_gpus, gpu_mem_bytes=t.gpu_mem_bytes, cpus=t.cpus, mem_bytes=t.mem_bytes
            ),
            submitted_at=t.submit_s,
            time_limit_s=t.duration_s,
            begin_time=t.begin_s if t.begin_s is not None and t.begin_s > t.submit_s else None,
        )
        for n, t in enumerate(trace_jobs)
    ]


def check_trace_fits(
    trace_jobs: Sequence[traces.TraceJob], gpus: int, rules: PlacementRules
) -> None:
    """Refuse jobs that no state of the simulated box could run (they would wait forever)."""
    for job in trace_jobs:
        if job.num_gpus > gpus:
            raise UsageError(
                f"job {job.job_id} asks for {job.num_gpus} GPUs; the simulated "
                f"box has {gpus}. Use --gpus {job.num_gpus} or more."
            )
        usable_bytes = GPU_MEM_BYTES - rules.mem_headroom_bytes
        if job.gpu_mem_bytes is not None and job.gpu_mem_bytes > usable_bytes:
            raise GpuschedError(
                f"job {job.job_id} asks for {job.gpu_mem_bytes} bytes per GPU; "
                f"simulated GPUs can give {usable_bytes} (80 GiB less the "
                "headroom). Fix its gpu_mem_bytes, or leave it empty for "
                "a whole GPU."
            )
    if any(a.submit_s > b.submit_s for a, b in itertools.pairwise(trace_jobs)):
        raise GpuschedError(
            "trace jobs are not in submission order; load them with "
            "traces.load_trace, which sorts them."
        )


class _Replay:
    """The simulation state between events; `run` is the event loop."""

    def __init__(
        self,
        jobs: list[Job],
        gpus: int,
        rules: PlacementRules,
        queue: QueueRules,
        half_life_s: float,
        links: Sequence[Sequence[str]] = (),
        reserved: Sequence[Reservation] = (),
    ):
        self.jobs, self.rules, self.queue, self.half_life_s = jobs, rules, queue, half_life_s
        self.inventory = simulated_box(gpus, links)
        self.gpus = gpus
        self.pending: list[Job] = []  # _PreemptiveReplay's queue; this one's is `line`
        # The queue in order, as the daemon keeps it: a pass reads only its head
        # (core/sched/pendingqueue.py), so 100,000 waiting jobs cost a pass little.
        self.line = PendingQueue(queue.discipline, per_user=bool(queue.quotas))
        self.waiting: dict[int, Job] = {}
        self.running: dict[int, Job] = {}
        self.ends: list[tuple[float, int]] = []  # heap of (expected end, job id)
        # A heap of the instants a pass may decide otherwise besides arrivals and ends:
        # waiting jobs' begin times, reservations' starts and ends.
        self.begins: list[float] = reservations.times(reserved)
        heapq.heapify(self.begins)
        self.reserved = {r.name: r for r in reserved}  # the daemon's filter (placement)
        self.usage: dict[str, float] = {}
        self.placements: dict[int, int] = {}  # GPU index -> jobs placed on it (round-robin)
        self.busy_gpus = 0
        self.pending_sizes: Counter[int] = Counter()
        # Whole-GPU jobs on identical idle cards fit exactly when enough GPUs are free,
        # so a pass can be skipped when none could; shared-memory jobs always get one.
        self.count_only = all(j.request.is_exclusive for j in jobs)
        self.started: dict[int, tuple[float, tuple[int, ...]]] = {}
        self.last_progress_s = 0.0  # the last arrival or start (quota_edge)
        # The GPUs' loads as placement.gpu_loads reads them, kept from pass to pass: only
        # the GPUs a start or an end touched since the last pass are read again.
        self.loads: dict[str, placement.GpuLoad] = {}
        self.stale_uuids = {gpu.uuid for gpu in self.inventory.gpus}

    def run(self) -> dict[int, tuple[float, tuple[int, ...]]]:
        # Semantics (these reproduce the trace README's reference rows): at each instant,
        # first every job that ends by then leaves, then every job submitted by then joins
        # the queue, then one scheduling pass starts whatever may start. One pass is a
        # fixpoint: nothing frees up during a pass, and skip-ahead already tried every job.
        arrival, last_s = 0, 0.0
        while arrival < len(self.jobs) or self.ends or self.begins or self.quota_edge(last_s):
            next_arrival_s = (
                self.jobs[arrival].submitted_at if arrival < len(self.jobs) else math.inf
            )
            now = min(
                next_arrival_s,
                self.ends[0][0] if self.ends else math.inf,
                self.begins[0] if self.begins else math.inf,  # a begin time is an instant too
                self.quota_edge(last_s) or math.inf,  # and a quota window's edge
            )
            while self.begins and self.begins[0] <= now:
                heapq.heappop(self.begins)
            if self.queue.discipline == "fairshare":
                running = list(self.running.values())
                self.usage = queuerules.decay_usage(
                    self.usage, running, now - last_s, self.half_life_s
                )
            last_s = now
            self.finish_until(now)
            while arrival < len(self.jobs) and self.jobs[arrival].submitted_at <= now:
                self.enqueue(self.jobs[arrival])
                self.pending_sizes[self.jobs[arrival].request.gpus] += 1
                arrival += 1
            if self.could_start():
                self.start_ready(now)
        if self.has_pending():  # check_trace_fits should have refused it
            first = self.first_pending()
            quota = f" under {first.user}'s quotas" if self.queue.quotas else ""
            raise GpuschedError(f"job {first.id} could never start on this box{quota}.")
        return self.started

    def quota_edge(self, now: float) -> float | None:
        """When a quota window next opens or closes, while jobs wait and one may start
        then: None once a day of edges went by with no arrival or start (none ever will)."""
        if not self.waiting or now - self.last_progress_s > quotas.DAY_MIN * 60:
            return None
        return quotas.next_change(self.queue.quotas, now, self.queue.minute_of)

    def enqueue(self, job: Job) -> None:
        self.last_progress_s = max(self.last_progress_s, job.submitted_at)
        self.line.add(job)
        self.waiting[job.id] = job
        if job.begin_time is not None:
            heapq.heappush(self.begins, job.begin_time)

    def has_pending(self) -> bool:
        return bool(self.waiting)

    def first_pending(self) -> Job:
        return next(iter(self.waiting.values()))  # the first to arrive of those left

    def finish_until(self, now: float) -> None:
        while self.ends and self.ends[0][0] <= now:
            _, job_id = heapq.heappop(self.ends)
            job = self.running.pop(job_id)
            self.busy_gpus -= job.request.gpus
            self.stale_uuids.update(job.gpu_uuids)

    def could_start(self) -> bool:
        if not self.has_pending():
            return False
        if not self.count_only:
            return True
        smallest = min(size for size, count in self.pending_sizes.items() if count)
        return smallest <= self.gpus - self.busy_gpus

    def start_ready(self, now: float) -> None:
        running = list(self.running.values())
        loads = self.current_loads(running)
        ordered = self.line.jobs(self.waiting, fair_share(self.queue, self.usage))
        plan = scheduling.schedule(
            ordered,
            running,
            loads,
            self.inventory,
            self.rules,
            self.queue,
            now,
            usage=self.usage,
            placements=self.placements,
            explain=False,
            line=self.line,
            reserved=self.reserved,
        )
        if not plan.starts:
            return
        self.placements = dict(plan.placements)
        self.last_progress_s = now
        for job_id, gpus in plan.starts:
            job = self.waiting.pop(job_id)
            self.line.remove(job)
            self.launch(job, gpus, now)

    def current_loads(self, running: list[Job]) -> dict[str, placement.GpuLoad]:
        """placement.gpu_loads of the box, reading again only the GPUs that changed."""
        if self.stale_uuids:
            stale = Inventory(tuple(g for g in self.inventory.gpus if g.uuid in self.stale_uuids))
            self.loads.update(placement.gpu_loads(stale, running, {}, self.rules))
            self.stale_uuids.clear()
        return self.loads

    def duration_s(self, job: Job) -> float:
        """How long the job truly runs: _as_jobs makes every job's limit its duration."""
        assert job.time_limit_s is not None
        return job.time_limit_s

    def launch(self, job: Job, gpus: Sequence[GpuInfo], now: float) -> None:
        job = lifecycle.start_run(
            job,
            now,
            gpu_uuids=tuple(g.uuid for g in gpus),
            gpu_indices=tuple(g.index for g in gpus),
        )
        self.running[job.id] = job
        self.stale_uuids.update(job.gpu_uuids)
        heapq.heappush(self.ends, (now + self.duration_s(job), job.id))
        self.busy_gpus += job.request.gpus
        self.pending_sizes[job.request.gpus] -= 1
        self.started[job.id] = (now, job.gpu_indices)


def _rules(policy: str, custom: Mapping[str, Policy] | None) -> PlacementRules:
    custom = dict(custom or {})
    if policy not in placement.BUILTIN_POLICIES and policy not in custom:
        custom = {**load_custom_policies(), **custom}
    names = [*placement.BUILTIN_POLICIES, *custom]
    if policy not in names:
        raise UsageError(f"unknown policy {policy!r}. Choose one of: {', '.join(names)}.")
    # The daemon's defaults for everything else, built as the daemon builds them.
    return placement_rules(Settings(policy=policy), custom)


def check_choices(
    gpus: int, policy: str, discipline: str, custom_policies: Mapping[str, Policy] | None = None
) -> PlacementRules:
    """The placement rules for a run; a bad GPU count or name is a UsageError."""
    if gpus < 1:
        raise UsageError(f"--gpus {gpus}: the simulated box needs at least 1 GPU.")
    if discipline not in DISCIPLINES:
        raise UsageError(
            f"unknown discipline {discipline!r}. Choose one of: {', '.join(DISCIPLINES)}."
        )
    return _rules(policy, custom_policies)


# Trace times from this on are seconds since the epoch; below it, seconds after a midnight.
EPOCH_TIMES_S = 10**8


def day_clock(origin_s: float) -> Callable[[float], float]:
    """The minute of the day of a trace time: epoch seconds in local time, as the daemon
    reads its windows; smaller times count from a midnight."""
    if origin_s >= EPOCH_TIMES_S:
        return lambda now: quotas.local_minute(origin_s + now)
    return lambda now: quotas.trace_minute(origin_s + now)


def simulate(
    trace_jobs: Sequence[traces.TraceJob],
    *,
    gpus: int,
    policy: str = Settings.policy,
    discipline: str = Settings.discipline,
    half_life_s: float = DEFAULT_HALF_LIFE_S,
    custom_policies: Mapping[str, Policy] | None = None,
    host: HostCapacity | None = None,
    links: Sequence[Sequence[str]] = (),
    quota_table: quotas.Quotas | None = None,
    groups: Mapping[str, Sequence[str]] | None = None,
    origin_s: float = 0.0,
    reserved: Sequence[Reservation] = (),
) -> list[JobResult]:
    """Every job's submit, start and end when `gpus` identical GPUs serve the trace.

    With `quota_table`, each trace user's quotas hold as in the daemon, their windows read
    at `origin_s` + the trace's time (day_clock); a user's groups are `groups`' (user ->
    group names), else the group database's.

    With `links` (core/topology.nvlink_islands), multi-GPU jobs get the best-linked GPUs,
    by the daemon's own placement code.

    Jobs must be in submission order (traces.load_trace sorts them). With `host`, CPUs
    and host memory are scheduled too, exactly as the daemon counts them. `reserved`: GPU
    reservations (times in the trace's), which no trace job runs in: they keep the others
    off their GPUs, by the daemon's own filter.
    """
    rules = check_choices(gpus, policy, discipline, custom_policies)
    check_trace_fits(trace_jobs, gpus, rules)
    jobs = _as_jobs(trace_jobs)
    if host is not None:
        too_big = next(
            (t for t in trace_jobs if t.cpus > host.cpus or (t.mem_bytes or 0) > host.mem_bytes),
            None,
        )
        if too_big is not None:
            raise UsageError(
                f"trace job {too_big.job_id} needs more CPUs or memory than the "
                f"simulated host has ({host.cpus} CPUs, "
                f"{host.mem_bytes / 2**30:.1f} GiB)"
            )
    queue = QueueRules(
        discipline=discipline,
        host=host,
        quotas=quota_table or quotas.Quotas(),
        groups_of=unix_groups if groups is None else (lambda user: groups.get(user, ())),
        minute_of=day_clock(origin_s),
    )
    for r in reserved:
        if max(r.gpus) >= gpus:
            raise UsageError(
                f"reservation {r.name} holds GPU {max(r.gpus)}; the simulated box has GPUs "
                f"0-{gpus - 1}"
            )
    started = _Replay(jobs, gpus, rules, queue, half_life_s, links, reserved).run()
    return results_of(trace_jobs, started)


def results_of(
    trace_jobs: Sequence[traces.TraceJob], started: Mapping[int, tuple[float, tuple[int, ...]]]
) -> list[JobResult]:
    """Each trace job's result, given when and where (by position) it started."""
    return [
        JobResult(
            t.job_id,
            t.tenant,
            t.num_gpus,
            t.duration_s,
            t.submit_s,
            started[n][0],
            started[n][0] + t.duration_s,
            started[n][1],
        )
        for n, t in enumerate(trace_jobs)
    ]


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all are equal, 1/n when one value holds everything."""
    squares = sum(v * v for v in values)
    return sum(values) ** 2 / (len(values) * squares) if squares else 1.0


def busy_gpu_s(results: Sequence[JobResult]) -> float:
    """GPU-seconds in which a GPU ran at least one job: jobs sharing a card count once."""
    if any(len(r.gpu_indices) != r.num_gpus for r in results):
        return sum(r.num_gpus * r.duration_s for r in results)
    spans: dict[int, list[tuple[float, float]]] = {}
    for r in results:
        for index in r.gpu_indices:
            spans.setdefault(index, []).append((r.start_s, r.end_s))
    busy_s = 0.0
    for intervals in spans.values():
        covered_to = -math.inf
        for start_s, end_s in sorted(intervals):
            busy_s += max(0.0, end_s - max(start_s, covered_to))
            covered_to = max(covered_to, end_s)
    return busy_s


def compute_metrics(results: Sequence[JobResult], gpus: int) -> Metrics:
    """Averages over jobs; makespan runs from the first submission to the last end."""
    if not results:
        raise GpuschedError("no jobs were simulated. Give a trace with at least one job.")
    jcts = [r.jct_s for r in results]
    makespan_s = max(r.end_s for r in results) - min(r.submit_s for r in results)
    busy_s = busy_gpu_s(results)
    by_tenant: dict[str, list[float]] = {}
    for r in results:
        by_tenant.setdefault(r.tenant, []).append(r.bounded_slowdown)
    return Metrics(
        jobs=len(results),
        tenants=len(by_tenant),
        avg_jct_s=statistics.fmean(jcts),
        median_jct_s=statistics.median(jcts),
        p99_jct_s=percentile(jcts, 99),
        avg_wait_s=statistics.fmean(r.wait_s for r in results),
        avg_bounded_slowdown=statistics.fmean(r.bounded_slowdown for r in results),
        makespan_s=makespan_s,
        gpu_utilization=busy_s / (gpus * makespan_s) if makespan_s > 0 else 0.0,
        jain_fairness=jain_index([statistics.fmean(v) for v in by_tenant.values()]),
    )
