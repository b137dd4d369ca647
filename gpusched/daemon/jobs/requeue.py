"""Stop a run and put its job back in the queue, or requeue an ended job: the one path that
preemption, `gpusched preempt`, `gpusched requeue` (and idle GPUs reclaimed) all take.

A running job to requeue is first stored as `requeueing` with when it gets SIGTERM, then
signalled: a daemon restarted midway finds both in the queue and goes on (the grace runs
on, SIGTERM goes once), so the job is neither lost nor requeued twice. Its end, whatever
its exit status, takes it through `preempted` to `pending` under the same id
(lifecycle.requeue): the next attempt, one more restart (GPUSCHED_RESTARTS), its logs
appended to (the shim opens them for appending).
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import replace
from functools import partial
from typing import Any

from gpusched.core import lifecycle
from gpusched.core.models import Job, JobState, transition
from gpusched.daemon.state import DaemonState
from gpusched.proc.seam import ProcessSeam

log = logging.getLogger("gpusched.jobs")


def stop_and_requeue(
    state: DaemonState,
    seam: ProcessSeam,
    job: Job,
    now: float,
    reason: str,
    signum: int = signal.SIGTERM,
    grace_s: float = 0.0,
    preempted_by: int | None = None,
) -> Job:
    """Begin to stop a running job so that it goes back to the queue (inside a write, or
    in a write of its own). `signum` goes first, once stored; unless that is SIGTERM,
    SIGTERM follows `grace_s` later (send_due_terms), and the shim sends SIGKILL after
    the cancel grace. `reason` says why, for `show` ("preempted by job 7", "requeued by
    alice"); `preempted_by` counts it as a preemption by that job. A job already on its
    way back is left as it is. Returns the job as stored."""
    if job.requeueing or not job.is_running:
        return job
    is_term = signum == signal.SIGTERM
    changed = replace(
        job,
        requeueing=True,
        requeue_reason=reason,
        requeue_term_at=None if is_term else now + grace_s,
    )
    if preempted_by is not None:
        changed = replace(
            changed, preempted_by=preempted_by, preempted_at=now, preemptions=job.preemptions + 1
        )
    with state.write():
        # A job being launched (its pid not known yet) may already run and write a
        # checkpoint: it gets the signal once its pid is (JobControl._found_shim; SIGTERM
        # by send_due_terms), its grace counted from now as for any job.
        if job.runner_pid is None and is_term:
            changed = replace(changed, requeue_term_at=now)
        state.save(changed)
        if job.runner_pid is not None:
            state.after_commit(lambda: seam.signal_job(changed, signum))
    log.info("job %d: stopping to requeue (%s)", job.id, reason)
    return changed


def is_being_stopped(job: Job) -> bool:
    """Whether gpusched is stopping the job after a checkpoint signal: to requeue it, or
    for its GPU memory (gpu_over = stop, daemon/jobs/gpuover.py). Its SIGTERM is due at
    requeue_term_at either way."""
    return job.requeueing or job.gpu_mem_stop


def send_due_terms(state: DaemonState, seam: ProcessSeam, now: float) -> None:
    """SIGTERM to each job being stopped whose grace has run out (stored as sent first:
    a restart does not send it again; the shim sends SIGKILL after the cancel grace)."""
    due = [
        job
        for job in state.running()
        if is_being_stopped(job)
        and job.runner_pid is not None
        and job.requeue_term_at is not None
        and job.requeue_term_at <= now
    ]
    if not due:
        return
    with state.write():
        for job in due:
            sent = replace(job, requeue_term_at=None)
            state.save(sent)
            state.after_commit(partial(seam.signal_job, sent, signal.SIGTERM))


def next_deadline(running: list[Job]) -> float | None:
    """When the next job being stopped gets SIGTERM (epoch seconds), if any."""
    return min(
        (
            job.requeue_term_at
            for job in running
            if is_being_stopped(job) and job.requeue_term_at is not None
        ),
        default=None,
    )


def is_requeued_end(job: Job) -> bool:
    """Whether a run that ended goes back to the queue: it was being requeued and not
    cancelled meanwhile (a cancel wins)."""
    return job.requeueing and not job.cancel_requested


def end_requeued(state: DaemonState, job: Job, when: float, **record: Any) -> Job:
    """Store the end of a run stopped to be requeued (inside a write): `preempted`, then
    `pending` again, whatever its exit status (a job that checkpoints and exits 0 on the
    signal has not finished its work). Returns the pending job."""
    preempted = transition(job, JobState.PREEMPTED, ended_at=when, **record)
    state.save(preempted)
    state.note_run_requeued(job, when)
    pending = lifecycle.requeue(preempted)
    state.save(pending)
    return pending


def requeue_ended(state: DaemonState, job: Job, reason: str) -> Job:
    """Put an ended job back in the queue (inside a write, or in one of its own), as
    `scontrol requeue` does: same id, next attempt, one more restart."""
    with state.write():
        state.note_run_requeued(job, job.ended_at or job.started_at or 0.0)
        pending = lifecycle.requeue(replace(job, requeue_reason=reason))
        state.save(pending)
    log.info("job %d requeued (%s)", job.id, reason)
    return pending


# -- the requests `requeue` and `preempt` (daemon/requests/changes.py hands each job here) ----------


class NotNow(Exception):
    """A job the request cannot requeue (a pending one): refused, the others go on."""


def checkpoint_signal(job: Job, configured: str) -> int:
    """The signal a job gets to checkpoint before it is stopped: its own --signal's, else
    the configured one ([preemption] signal)."""
    if job.warn_signal is not None:
        return job.warn_signal
    return int(getattr(signal, f"SIG{configured}"))


def local_time(now: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))


def requeue_one(state: DaemonState, seam: ProcessSeam, job: Job, now: float, who: str) -> str:
    """`gpusched requeue`, as `scontrol requeue`: a running job stopped now (SIGTERM, then
    SIGKILL after the cancel grace) and queued again; an ended one queued again."""
    reason = f"requeued by {who} at {local_time(now)}"
    if job.state is JobState.PENDING:
        raise NotNow("pending; only running and ended jobs can be requeued")
    if job.state.is_final:
        requeue_ended(state, job, reason)
        return "requeued"
    if job.requeueing:
        return "already being requeued"
    stop_and_requeue(state, seam, job, now, reason)
    return "stopping; it goes back to the queue when it ends"


def preempt_one(
    state: DaemonState, seam: ProcessSeam, job: Job, now: float, who: str, configured_signal: str
) -> str:
    """`gpusched preempt`: a running job sent its checkpoint signal, given its grace,
    stopped and queued again, whatever waits."""
    if not job.is_running:
        raise NotNow(f"{job.state.value}; only running jobs can be preempted")
    if job.requeueing:
        return "already being requeued"
    signum = checkpoint_signal(job, configured_signal)
    stop_and_requeue(
        state,
        seam,
        job,
        now,
        f"preempted by {who} at {local_time(now)}",
        signum=signum,
        grace_s=job.preempt_grace_s,
    )
    return (
        f"preempting: {signal.Signals(signum).name} now, SIGTERM in "
        f"{job.preempt_grace_s:g}s unless it ends first; then it goes back to the queue"
    )
