"""GPU memory promises kept: a sharing job over its --gpu-mem is reported, stopped or requeued with more."""

from __future__ import annotations

import logging
import signal
from dataclasses import replace

from gpusched.core.models import Job
from gpusched.core.sched import gpupromise
from gpusched.daemon.jobs import requeue
from gpusched.daemon.state import DaemonState, Setup
from gpusched.proc.seam import ProcessSeam

log = logging.getLogger("gpusched.gpuover")


class GpuOver:
    """After each GPU reading: judge the sharing jobs against their --gpu-mem, and act
    once on each run that went over ([memory] gpu_over, or the job's --gpu-mem-over)."""

    def __init__(self, state: DaemonState, setup: Setup, seam: ProcessSeam):
        self.state, self.setup, self.seam = state, setup, seam

    def step(self, now: float) -> None:
        settings, state = self.setup.settings, self.state
        found = gpupromise.over_promise(
            state.inventory,
            state.running(),
            state.pid_jobs,
            settings.gpu_over_margin_pct,
            settings.gpu_free_floor_bytes,
        )
        for over in found:
            job = state.jobs.get(over.job_id)
            if job is None or not job.is_running or job.requeueing or job.cancel_requested:
                continue
            if job.gpu_mem_stop:
                if over.is_under_floor and (job.requeue_term_at or 0.0) > now:
                    # No more grace: its neighbours' memory is at stake.
                    with state.write():
                        state.save(replace(job, requeue_term_at=now))
                continue
            action = job.gpu_mem_over or settings.gpu_over
            if not job.gpu_mem_over_by or action != "report":  # reported, then `update`d
                self.act(job, over, action, now)

    def act(self, job: Job, over: gpupromise.Over, action: str, now: float) -> None:
        log.info("job %d %s: gpu_over = %s", job.id, over.text, action)
        self.seam.append_to_log(
            job.stderr_path, f"job {job.id} {over.text} (gpu_over = {action})", job.uid
        )
        settings = self.setup.settings
        checkpoint = requeue.checkpoint_signal(job, settings.preempt_signal)
        if action == "requeue":
            # Its next run's --gpu-mem is raised when this one ends, from its peak by then
            # (gpumemory.settle_end).
            requeue.stop_and_requeue(
                self.state,
                self.seam,
                replace(job, gpu_mem_over_by=over.text),
                now,
                f"requeued for GPU memory ({over.text}; gpu_over = requeue)",
                checkpoint,
                0.0 if over.is_under_floor else job.preempt_grace_s,
            )
            return
        if action == "report":
            with self.state.write():
                self.state.save(replace(job, gpu_mem_over_by=over.text))
            return
        # stop: as a requeue (requeue.py), but to its end: the checkpoint signal, then
        # SIGTERM at requeue_term_at, stored so that a restarted daemon keeps the grace.
        if checkpoint == signal.SIGTERM:
            term_at = None if job.runner_pid is not None else now  # else once its pid is known
        else:
            term_at = now + (0.0 if over.is_under_floor else job.preempt_grace_s)
        changed = replace(
            job, gpu_mem_over_by=over.text, gpu_mem_stop=True, requeue_term_at=term_at
        )
        with self.state.write():
            self.state.save(changed)
            if job.runner_pid is not None:
                self.state.after_commit(lambda: self.seam.signal_job(changed, checkpoint))
