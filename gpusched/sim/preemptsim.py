"""Trace replay with priorities and, optionally, preemption (`gpusched simulate --preemption`).

A seeded share of the trace's jobs is made urgent (priority HIGH_PRIORITY; a trace has no
priorities of its own); every other job is preemptible. With preemption, an urgent job
that cannot start stops the jobs core/preemption.choose_victims picks, as the daemon does:
each victim runs on for its grace, checkpoints then (no work is lost), and goes back to
the queue with the work it has left plus a restart cost; its GPUs are kept for the urgent
job meanwhile (scheduling's held GPUs). One preemption is under way at a time.

Under las (`--discipline las`) a job also preempts those of its priority in a later queue
(queuerules.outranks): the replay keeps each job's attained GPU-seconds, and wakes when a
running job's attained service crosses a bound or a waiting job is moved up for waiting.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpusched.core.models import GpuInfo, Job, JobState
from gpusched.core.sched import placement, preemption, queuerules, scheduling
from gpusched.sim import simulator, traces
from gpusched.sim.simulator import JobResult, _Replay

HIGH_PRIORITY = 10
DEFAULT_HIGH_SHARE = 0.1


@dataclass(frozen=True)
class PreemptionModel:
    """How a preemption plays out in simulated time (the daemon's defaults)."""

    grace_s: float = 60.0  # the victim runs on this long, then checkpoints and stops
    restart_s: float = 60.0  # added to its remaining work: start-up and reload
    rules: preemption.PreemptionRules = field(default_factory=preemption.PreemptionRules)


def urgent_ids(count: int, share: float, seed: int) -> frozenset[int]:
    """Which of `count` jobs (by position) are urgent: a seeded random `share` of them."""
    return frozenset(random.Random(seed).sample(range(count), round(share * count)))


class _PreemptiveReplay(_Replay):
    """_Replay, with ends that may move (a victim stops early) and preemption after passes."""

    def __init__(self, jobs: list[Job], gpus: int, model: PreemptionModel | None, **kwargs: Any):
        super().__init__(jobs, gpus, **kwargs)
        self.model = model
        self.count_only = False  # held GPUs and priorities: every event needs a pass
        self.end_at: dict[int, float] = {}  # running job id -> when it ends or stops
        self.stopping: dict[int, float] = {}  # victim id -> work it will have left
        self.stopping_for: dict[int, int] = {}  # victim id -> the urgent job's id
        self.ended: dict[int, float] = {}
        self.wakes: set[float] = set()
        self.preemptions = 0
        self.attained: dict[int, float] = {}  # job id -> GPU-seconds of its stopped runs
        self.lost_gpu_s = 0.0  # restart costs: GPU time spent on no work

    def enqueue(self, job: Job) -> None:
        self.pending.append(job)  # changed in place by preemption: a plain list

    def has_pending(self) -> bool:
        return bool(self.pending)

    def first_pending(self) -> Job:
        return self.pending[0]

    def finish_until(self, now: float) -> None:
        while self.ends and self.ends[0][0] <= now:
            when, job_id = heapq.heappop(self.ends)
            if self.end_at.get(job_id) != when:
                continue  # an end a preemption moved
            del self.end_at[job_id]
            job = self.running.pop(job_id)
            self.busy_gpus -= job.request.gpus
            left_s = self.stopping.pop(job_id, 0.0)
            self.stopping_for.pop(job_id, None)
            if left_s <= 0:
                self.ended[job_id] = when
                continue
            assert job.started_at is not None  # a running job
            self.attained[job_id] = self.attained.get(job_id, 0.0) + job.request.gpus * (
                when - job.started_at
            )
            restart_s = self.model.restart_s if self.model is not None else 0.0
            self.lost_gpu_s += job.request.gpus * restart_s
            again = replace(
                job,
                preempted_at=when,
                state=JobState.PENDING,
                started_at=None,
                gpu_uuids=(),
                gpu_indices=(),
                requeueing=False,
                time_limit_s=left_s + restart_s,
            )
            self.pending.append(again)
            self.pending_sizes[again.request.gpus] += 1

    def start_ready(self, now: float) -> None:
        while self._start_pass(now):
            pass
        self._release_holds()
        if self.model is not None and self.model.rules.enabled:
            self._preempt(now, self.model)

    def _start_pass(self, now: float) -> bool:
        running = list(self.running.values())
        loads = placement.gpu_loads(self.inventory, running, {}, self.rules)
        plan = scheduling.schedule(
            self.pending,
            running,
            loads,
            self.inventory,
            self.rules,
            self.queue,
            now,
            usage=self.usage,
            placements=self.placements,
            explain=False,
            held=preemption.held_gpus(self.pending),
            attained=self.attained,
        )
        if not plan.starts:
            return False
        self.placements = dict(plan.placements)
        chosen = dict(plan.starts)
        still = []
        for job in self.pending:
            if job.id in chosen:
                self.launch(replace(job, preempt_hold=()), chosen[job.id], now)
            else:
                still.append(job)
        self.pending = still
        return True

    def launch(self, job: Job, gpus: Sequence[GpuInfo], now: float) -> None:
        first = self.started.get(job.id)
        super().launch(job, gpus, now)
        if first is not None:
            self.started[job.id] = first  # a job's wait ends at its first start
        assert job.time_limit_s is not None  # _as_jobs: every job's limit is its duration
        self.end_at[job.id] = now + job.time_limit_s

    def _release_holds(self) -> None:
        urgent = set(self.stopping_for.values())
        self.pending = [
            replace(j, preempt_hold=()) if j.preempt_hold and j.id not in urgent else j
            for j in self.pending
        ]

    def _preempt(self, now: float, model: PreemptionModel) -> None:
        if self.stopping:
            return  # one preemption at a time, as in the daemon
        running = list(self.running.values())
        lowest = min((j.priority for j in running if j.preemptible), default=None)
        if lowest is None:
            return
        las = self.queue.discipline == "las"
        loads = placement.gpu_loads(self.inventory, running, {}, self.rules)
        ready = [j for j in self.pending if (las or j.priority > lowest) and j.request.gpus]
        queue, attained = self.queue, self.attained

        def outranks(urgent: Job, victim: Job) -> bool:
            return queuerules.outranks(urgent, victim, queue, attained, now)

        for urgent in queuerules.queue_order(ready, queue, self.usage, now, attained):
            victims = preemption.choose_victims(
                urgent, running, loads, self.rules, model.rules, now, outranks=outranks
            )
            if victims:
                self._stop(urgent, victims, now, model.grace_s)
                return
        if las and ready:
            self._wake_when_queues_change(running, ready, now, model.rules.min_run_s)
        elif ready:
            self._wake_when_protection_ends(
                running, max(j.priority for j in ready), now, model.rules.min_run_s
            )

    def _wake_when_protection_ends(
        self, running: list[Job], priority: int, now: float, min_run_s: float
    ) -> None:
        """An event when the next job that may be preempted for an urgent one leaves its
        first minutes (the daemon weighs preemption again at each GPU poll)."""
        later = [
            j.started_at + min_run_s
            for j in running
            if j.started_at is not None
            and j.preemptible
            and j.priority < priority
            and j.started_at + min_run_s > now
        ]
        if later and min(later) not in self.wakes:
            self.wakes.add(min(later))
            heapq.heappush(self.ends, (min(later), -1))  # no job: finish_until skips it

    def _wake_when_queues_change(
        self, running: list[Job], ready: list[Job], now: float, min_run_s: float
    ) -> None:
        """An event at the next instant a preemption may become possible under las: a
        running job's attained service crosses a queue's bound (no earlier than its first
        minutes end), or a waiting job is moved to the first queue or may preempt smaller
        jobs of its own."""
        rules, later = self.queue, []
        for job in running:
            if job.started_at is None or not job.preemptible or not job.request.gpus:
                continue
            done = queuerules.attained_gpu_s(job, self.attained, now)
            bound = next((b for b in rules.las_thresholds_gpu_s if b > done), None)
            if bound is not None:
                crosses = now + (bound - done) / job.request.gpus
                later.append(max(crosses, job.started_at + min_run_s))
            if job.started_at + min_run_s > now:
                later.append(job.started_at + min_run_s)
        for job in ready:
            earlier = self.attained.get(job.id, 0.0)
            wait_s = max(rules.las_starvation_floor_s, rules.las_starvation_factor * earlier)
            later.append(queuerules.waiting_since(job) + wait_s)
            if rules.las_preempt_smaller_after_s:
                later.append(queuerules.waiting_since(job) + rules.las_preempt_smaller_after_s)
        upcoming = [t for t in later if t > now]
        if upcoming and min(upcoming) not in self.wakes:
            self.wakes.add(min(upcoming))
            heapq.heappush(self.ends, (min(upcoming), -1))  # no job: finish_until skips it

    def _stop(self, urgent: Job, victims: tuple[Job, ...], now: float, grace_s: float) -> None:
        stop_s = now + grace_s
        for victim in victims:
            end_s = self.end_at[victim.id]
            self.running[victim.id] = replace(
                victim, requeueing=True, preemptions=victim.preemptions + 1
            )
            self.preemptions += 1
            if end_s <= stop_s:
                continue  # it ends within its grace anyway
            self.stopping[victim.id] = end_s - stop_s
            self.stopping_for[victim.id] = urgent.id
            self.end_at[victim.id] = stop_s
            heapq.heappush(self.ends, (stop_s, victim.id))
        hold = tuple(uuid for v in victims for uuid in v.gpu_uuids)
        self.pending = [
            replace(j, preempt_hold=hold) if j.id == urgent.id else j for j in self.pending
        ]


def simulate_with_priorities(
    trace_jobs: Sequence[traces.TraceJob],
    *,
    gpus: int,
    urgent: frozenset[int],
    model: PreemptionModel | None,
    policy: str = "pack",
    discipline: str = "fifo",
    half_life_s: float = simulator.DEFAULT_HALF_LIFE_S,
) -> tuple[list[JobResult], int]:
    """Every job's submit, first start and final end, with the jobs at the positions in
    `urgent` at priority HIGH_PRIORITY, and preemption when `model` is given; and how
    many preemptions there were."""
    results, replay = replay_with_priorities(
        trace_jobs,
        gpus=gpus,
        urgent=urgent,
        model=model,
        policy=policy,
        queue=queuerules.QueueRules(discipline=discipline),
        half_life_s=half_life_s,
    )
    return results, replay.preemptions


def replay_with_priorities(
    trace_jobs: Sequence[traces.TraceJob],
    *,
    gpus: int,
    urgent: frozenset[int],
    model: PreemptionModel | None,
    policy: str,
    queue: queuerules.QueueRules,
    half_life_s: float = simulator.DEFAULT_HALF_LIFE_S,
) -> tuple[list[JobResult], _PreemptiveReplay]:
    """simulate_with_priorities under the queue's rules (las's settings), with the replay
    for its counts (preemptions, lost_gpu_s)."""
    discipline = queue.discipline
    rules = simulator.check_choices(gpus, policy, discipline)
    simulator.check_trace_fits(trace_jobs, gpus, rules)
    jobs = [
        replace(job, priority=HIGH_PRIORITY if job.id in urgent else 0, preemptible=True)
        for job in simulator._as_jobs(trace_jobs)
    ]
    replay = _PreemptiveReplay(jobs, gpus, model, rules=rules, queue=queue, half_life_s=half_life_s)
    started = replay.run()
    # Where a job ran is left out: a preempted job ran in several places.
    return [
        JobResult(
            t.job_id, t.tenant, t.num_gpus, t.duration_s, t.submit_s, started[n][0], replay.ended[n]
        )
        for n, t in enumerate(trace_jobs)
    ], replay
