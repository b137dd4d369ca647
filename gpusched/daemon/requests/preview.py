"""A submit's preview (`dry_run`): the GPUs its first job would start on now, or why it would wait."""

from __future__ import annotations

from typing import Any

from gpusched.core.models import job_with
from gpusched.core.sched import placement, scheduling
from gpusched.daemon.jobs.depstates import DependencyLookup
from gpusched.daemon.state import DaemonState, Setup

# An id no queued job has: the previewed job is never stored.
PREVIEW_ID = 0


def preview(
    state: DaemonState, setup: Setup, template: Any, count: int, to_cluster: bool
) -> dict[str, Any]:
    """What a pass run now would do with the template's job if it were next in line
    (the pending jobs that may go first are only counted: the pass decides their turn);
    template: the checked job the submit would queue, count: how many it would queue,
    to_cluster: a Slurm cluster's job, which this machine never places."""
    reply = {"dry_run": True, "jobs": count, "pending_ahead": state.pending_count()}
    if to_cluster:
        return {**reply, "would_start": False, "gpu_indices": [], "reason": template.pending_reason}
    now = setup.clock.time()
    running = state.running()
    loads = placement.gpu_loads(
        state.inventory, running, state.pid_jobs, setup.rules, state.idle_since, now
    )
    queue_rules = setup.queue_rules(state.draining)
    job = job_with(template, id=PREVIEW_ID)
    plan = scheduling.schedule(
        [job],
        running,
        loads,
        state.inventory,
        setup.rules,
        queue_rules,
        now,
        DependencyLookup(state.jobs, state.store),
        state.usage.usage,
        attained=state.attained,
        reserved=state.reservations,
    )
    gpus = next((chosen for job_id, chosen in plan.starts if job_id == PREVIEW_ID), None)
    return {
        **reply,
        "would_start": gpus is not None,
        "gpu_indices": [gpu.index for gpu in gpus or ()],
        "reason": None if gpus is not None else plan.reasons.get(PREVIEW_ID, job.pending_reason),
    }
