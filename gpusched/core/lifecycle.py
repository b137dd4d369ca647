"""Pure job lifecycle: how a run ends (state, retries) and when time limits act."""

from __future__ import annotations

import math
import signal
from dataclasses import replace
from typing import Any

from gpusched.core.models import Job, JobState, transition
from gpusched.core.spec.begintime import begin_text
from gpusched.core.spec.syntax import signal_name
from gpusched.core.units import duration_human, size_human

WARN = "warn"
TERMINATE = "terminate"
# The delay before a retry doubles after each failed attempt, up to this (or up to the
# job's own --retry-delay, when that is longer).
RETRY_DELAY_CAP_S = 300.0
# How a run ended, as a pending reason says it: "retrying after attempt 2 timed out".
_ENDED = {
    "failed": "failed",
    "timeout": "timed out",
    "cancelled": "was cancelled",
    "oom": "ran out of memory",
    "lost": "was lost",
    "preempted": "was preempted",
    "gpu_oom": "ran out of GPU memory",
}


def end_state(job: Job, exit_code: int | None, error: str) -> JobState:
    """The state a run ended in, from the exit record and what the daemon asked of it."""
    if job.timed_out:
        return JobState.TIMEOUT
    if job.oom_killed:
        return JobState.OOM
    if job.cancel_requested:
        return JobState.CANCELLED
    if job.gpu_mem_stop:  # stopped for using more GPU memory than it asked for
        return JobState.GPU_OOM
    if exit_code == 0 and not error:
        return JobState.SUCCEEDED
    return JobState.FAILED


def end_reason(
    job: Job, state: JobState, exit_code: int | None, signum: int | None, error: str
) -> str:
    """Why a run ended, in words: the shim's error, else what gpusched did to the job.

    A cancel stores who asked in end_reason while the job still runs (handlers); this
    adds how the job went: `cancelled by alice while running (SIGTERM)`.
    """
    if error:
        return error
    if state not in (JobState.CANCELLED, JobState.TIMEOUT, JobState.OOM, JobState.GPU_OOM):
        return ""
    if signum == signal.SIGKILL and state is not JobState.OOM:
        how = " (SIGKILL once the grace period after SIGTERM ran out)"
    elif signum:
        how = f" ({signal_name(signum)})"
    elif exit_code is not None:
        how = f" (it exited with status {exit_code} after SIGTERM)"
    else:
        how = ""
    if state is JobState.TIMEOUT:
        return f"time limit of {duration_human(job.time_limit_s)} reached{how}"
    if state is JobState.GPU_OOM:
        return f"stopped: {job.gpu_mem_over_by} (gpu_over = stop){how}"
    if state is JobState.OOM:
        return (
            f"used more host memory than its --mem of {size_human(job.request.mem_bytes)}"
            f" (enforce_mem){how}"
        )
    return f"{job.end_reason or 'cancelled'} while running{how}"


# What a job's next run starts without: the last run's GPUs, shim, port, flags and host
# memory (its GPU memory peak stays: placement counts it).
_NEXT_RUN = {
    "started_at": None,
    "gpu_uuids": (),
    "gpu_indices": (),
    "master_port": None,
    "runner_pid": None,
    "runner_start_time": None,
    "cancel_requested": False,
    "warned": False,
    "timed_out": False,
    "oom_killed": False,
    "cpu_ids": (),
    "requeueing": False,
    "requeue_term_at": None,
    "end_reason": "",
    "mem_peak_bytes": None,
    "mem_over": False,
    "gpu_mem_over_by": "",
    "gpu_mem_stop": False,
}
# A retry's pending job keeps its last run's exit code and signal (`show` says how it
# ended); the run it starts has its own, so they go as it starts.
_LAST_OUTCOME = {
    "exit_code": None,
    "signal": None,
    "mem_peak_bytes": None,
    "mem_over": False,
    "gpu_mem_over_by": "",
}


def start_run(job: Job, now: float, **placed: Any) -> Job:
    """A pending job, running from now on the GPUs (and port...) in `placed`."""
    return transition(job, JobState.RUNNING, started_at=now, **_LAST_OUTCOME, **placed)


def finish(job: Job, state: JobState, now: float, retry: bool = True, **record: Any) -> Job:
    """End a run: a final state, or back to the queue while retries last for this end
    (and unless retry is False: a retry would be no use). Runs stopped to be requeued
    (restarts) do not use up retries."""
    if retry and state.value in job.retry_on and job.attempt - job.restarts <= job.retries:
        again = transition(
            job,
            JobState.PENDING,
            **_NEXT_RUN,
            attempt=job.attempt + 1,
            eligible_at=now + retry_delay_s(job),
            last_attempt_end=state.value,
            exit_code=record.get("exit_code"),
            signal=record.get("signal"),
        )
        return replace(again, pending_reason=retry_reason(again, now))
    return transition(job, state, ended_at=now, **record)


def cancel_unstarted(job: Job, who: str, now: float) -> Job:
    """A job cancelled before any run of it started: here pending, or never handed to Slurm."""
    return transition(
        job, JobState.CANCELLED, ended_at=now, end_reason=f"cancelled by {who} before it started"
    )


def requeue(job: Job) -> Job:
    """A preempted job, or an ended one, back in the queue as `scontrol requeue` puts it:
    the same id, the next attempt, one more restart, eligible at once."""
    pending = transition(
        job,
        JobState.PENDING,
        **_NEXT_RUN,
        ended_at=None,
        eligible_at=None,
        attempt=job.attempt + 1,
        restarts=job.restarts + 1,
        last_attempt_end=job.state.value,
    )
    # The reason says who: "requeued by alice at ...", "preempted by job 7 (...) at ...".
    return replace(pending, pending_reason=job.requeue_reason or "requeued")


def retry_delay_s(job: Job) -> float:
    """How long after this attempt ends the next may start: the job's delay, doubled for
    each attempt before this one, at most RETRY_DELAY_CAP_S (or the delay itself)."""
    doubled = job.retry_delay_s * 2.0 ** min(job.attempt - 1, 32)
    return min(doubled, max(RETRY_DELAY_CAP_S, job.retry_delay_s))


def is_waiting_to_retry(job: Job, now: float) -> bool:
    return job.eligible_at is not None and job.eligible_at > now


def waits_to_begin(job: Job, now: float) -> bool:
    """Whether --begin keeps the job back. A held job's reason is its hold: once
    released, it waits for its begin time."""
    return job.begin_time is not None and job.begin_time > now and not job.held


def begin_reason(job: Job) -> str:
    """The pending reason of a job whose --begin time is to come, as Slurm's BeginTime."""
    return f"BeginTime (starts at {begin_text(job.begin_time or 0.0)})"


def retry_reason(job: Job, now: float) -> str:
    """The pending reason of a re-queued job that may not start yet."""
    ended = _ENDED.get(job.last_attempt_end, f"ended {job.last_attempt_end}")
    wait_s = math.ceil(max((job.eligible_at or now) - now, 0.0))
    return f"retrying after attempt {job.attempt - 1} {ended}; eligible in {wait_s}s"


def mem_limit_bytes(job: Job, margin_pct: float) -> int | None:
    """Host memory past which a job counts as over its --mem (None: nothing declared)."""
    if job.request.mem_bytes is None:
        return None
    return int(job.request.mem_bytes * (1 + margin_pct / 100))


def mem_warning(job: Job, rss_bytes: int, limit_bytes: int) -> str:
    mem = job.request.mem_bytes
    assert mem is not None, f"job {job.id} has no --mem"  # its limit came from it
    return (
        f"job {job.id} uses {rss_bytes / 2**20:.0f} MiB of host memory, over its "
        f"--mem of {mem / 2**20:.0f} MiB plus margin "
        f"({limit_bytes / 2**20:.0f} MiB)"
    )


def limit_deadline(job: Job) -> float | None:
    """When the job's time limit runs out (None: no limit, or not running)."""
    if job.time_limit_s is None or job.started_at is None:
        return None
    return job.started_at + job.time_limit_s


def next_limit_action(job: Job) -> tuple[float, str] | None:
    """(when, what) the daemon must do next about this running job's time limit."""
    deadline = limit_deadline(job)
    if deadline is None or job.timed_out:
        return None
    if job.warn_signal is not None and not job.warned:
        return deadline - job.warn_before_s, WARN
    return deadline, TERMINATE


def apply_limit_action(job: Job, action: str) -> tuple[Job, int]:
    """The job after the action, and the signal to send it."""
    if action == WARN:
        return replace(job, warned=True), int(job.warn_signal or signal.SIGUSR1)
    return replace(job, timed_out=True), int(signal.SIGTERM)
