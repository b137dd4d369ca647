"""Preemption in the daemon: after a scheduling pass, stop preemptible jobs of a lower
priority for a job that cannot start otherwise, and keep their GPUs for it.

The choice is core/preemption.choose_victims (the simulator makes the same); the stopping
is daemon/jobs/requeue.py's. One preemption is under way at a time: the next is weighed once
its victims are gone, against the GPUs as they are then.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from gpusched.core import lifecycle
from gpusched.core.models import Job, JobState
from gpusched.core.sched import placement, preemption, queuerules, reservations, scheduling
from gpusched.core.sched.dependencies import dependency_status
from gpusched.core.sched.passcounts import new_pass
from gpusched.daemon.jobs import requeue
from gpusched.daemon.state import DaemonState, Setup
from gpusched.proc.seam import ProcessSeam

log = logging.getLogger("gpusched.jobs")


def rules_of(setup: Setup) -> preemption.PreemptionRules:
    s = setup.settings
    return preemption.PreemptionRules(
        s.preemption_enabled,
        s.max_preemptions,
        s.min_run_before_preempt_s,
        las_max_preemptions=s.las_max_preemptions,
    )


def release_spent_holds(state: DaemonState, holders: list[Job], started: set[int]) -> None:
    """A job that preempted others keeps their GPUs while any of them is still stopping;
    once all are gone, the pass just made gave it first pick, and the hold ends (it
    started, or the GPUs went elsewhere: outside processes, a failed GPU)."""
    stopping = {job.preempted_by for job in state.running() if job.requeueing}
    for job in holders:
        if job.id not in started and job.id not in stopping:
            state.save(replace(job, preempt_hold=()))


def preempt_for_reservations(
    state: DaemonState, setup: Setup, seam: ProcessSeam, now: float
) -> None:
    """Preemptible jobs outside a reservation still on its GPUs once it starts: each goes
    back to the queue as a preempted one does (its checkpoint signal, then its grace)."""
    for victim, reserved in reservations.preempt_for(state.running(), state.reservations, now):
        requeue.stop_and_requeue(
            state,
            seam,
            victim,
            now,
            f"preempted for reservation {reserved.name} at {requeue.local_time(now)}",
            signum=requeue.checkpoint_signal(victim, setup.settings.preempt_signal),
            grace_s=victim.preempt_grace_s,
        )
        log.info("job %d preempted for reservation %s", victim.id, reserved.name)


def preempt_for_waiting(
    state: DaemonState,
    setup: Setup,
    seam: ProcessSeam,
    dep_states: Mapping[int, JobState],
    now: float,
) -> Job | None:
    """Begin one preemption, for the most urgent pending job that only GPUs held by
    preemptible jobs of a lower priority keep from starting; the job it is for, or None.
    Call after a pass that started nothing (the GPUs are then as the loads say)."""
    rules = rules_of(setup)
    running = state.running()
    if not rules.enabled or state.draining or any(j.requeueing and j.preempted_by for j in running):
        return None
    lowest = min((j.priority for j in running if j.preemptible), default=None)
    if lowest is None:
        return None
    loads = placement.gpu_loads(
        state.inventory,
        running,
        state.pid_jobs,
        setup.rules,
        state.idle_since,
        now,
        state.outside_peaks,
    )
    observed = placement.observed_usage(state.inventory, state.pid_jobs)
    queue = setup.queue_rules(state.draining)

    def outranks(urgent: Job, victim: Job) -> bool:
        return queuerules.outranks(urgent, victim, queue, state.attained, now)

    counts = new_pass(running, loads, {}, now)  # for the users' quotas
    for urgent in _candidates(state, queue, dep_states, lowest, now):
        if scheduling.quota_reason(urgent, counts, queue, now):
            continue  # its user's quota, not GPUs, keeps it waiting
        # Only the GPUs it may be placed on (a reservation's may be closed to it).
        closed = reservations.closed_gpus(
            urgent, state.reservations, now, (load.gpu.index for load in loads.values())
        )
        usable = {u: load for u, load in loads.items() if load.gpu.index not in closed}
        victims = preemption.choose_victims(
            urgent, running, usable, setup.rules, rules, now, observed, outranks
        )
        if victims:
            _preempt(state, setup, seam, urgent, victims, now)
            return urgent
    return None


def _candidates(
    state: DaemonState,
    rules: queuerules.QueueRules,
    dep_states: Mapping[int, JobState],
    lowest: int,
    now: float,
) -> list[Job]:
    """Pending jobs that may start now but for GPUs, above the lowest preemptible
    priority (or at it, under las, where a queue may outrank), in queue order."""
    floor = lowest if rules.discipline == "las" else lowest + 1
    # First as held (templates answer these: daemon/jobs/jobtable.py), then built.
    able = (
        state.jobs[job_id]
        for job_id, job in state.pending_alike()
        if job.priority >= floor
        and job.request.gpus
        and not job.held
        and not lifecycle.is_waiting_to_retry(job, now)
        and not job.preempt_hold
    )
    ready = [job for job in able if dependency_status(job, dep_states) == (False, "")]
    return queuerules.queue_order(ready, rules, state.usage.usage, now, state.attained)


def _preempt(
    state: DaemonState,
    setup: Setup,
    seam: ProcessSeam,
    urgent: Job,
    victims: tuple[Job, ...],
    now: float,
) -> None:
    when = requeue.local_time(now)
    ids = tuple(v.id for v in victims)
    with state.write():
        for victim in victims:
            signum = requeue.checkpoint_signal(victim, setup.settings.preempt_signal)
            requeue.stop_and_requeue(
                state,
                seam,
                victim,
                now,
                f"preempted by job {urgent.id} ({urgent.user}, priority {urgent.priority}) "
                f"at {when}",
                signum=signum,
                grace_s=victim.preempt_grace_s,
                preempted_by=urgent.id,
            )
        victim_list = ", ".join(map(str, ids))
        state.save(
            replace(
                urgent,
                preempted_jobs=ids,
                preempted_jobs_at=now,
                preempt_hold=tuple(uuid for v in victims for uuid in v.gpu_uuids),
                pending_reason=f"preempting job{'s' if len(ids) > 1 else ''} {victim_list}; "
                "their GPUs are kept for it",
            )
        )
    log.info("job %d preempts %s", urgent.id, ids)
