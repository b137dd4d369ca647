"""GPU memory promises kept: a sharing job over its --gpu-mem is reported, stopped or requeued with more."""

from __future__ import annotations

import logging
import signal
from dataclasses import replace
from functools import partial

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
        # Jobs being stopped: when each gets SIGTERM after its checkpoint signal. In
        # memory: a restarted daemon sends SIGTERM at once to a job it finds stopping.
        self.term_at: dict[int, float] = {}

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
                if over.is_under_floor:  # no more grace: its neighbours' memory is at stake
                    self.term_at[job.id] = min(self.term_at.get(job.id, now), now)
                continue
            action = job.gpu_mem_over or settings.gpu_over
            if not job.gpu_mem_over_by or action != "report":  # reported, then `update`d
                self.act(job, over, action, now)
        self.send_due_terms(now)

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
        stop = action == "stop"
        changed = replace(job, gpu_mem_over_by=over.text, gpu_mem_stop=stop)
        with self.state.write():
            self.state.save(changed)
            if stop:
                self.state.after_commit(lambda: self.seam.signal_job(changed, checkpoint))
        if stop and checkpoint == signal.SIGTERM:
            self.term_at[job.id] = float("inf")  # sent already
        elif stop:
            self.term_at[job.id] = now + (0.0 if over.is_under_floor else job.preempt_grace_s)

    def send_due_terms(self, now: float) -> None:
        """SIGTERM to each job being stopped whose grace ran out (the shim sends SIGKILL
        after the cancel grace)."""
        stopping = [job for job in self.state.running() if job.gpu_mem_stop]
        self.term_at = {job.id: self.term_at.get(job.id, now) for job in stopping}
        due = [job for job in stopping if self.term_at[job.id] <= now]
        if not due:
            return
        with self.state.write():  # after the checkpoint signal, which waits for a commit
            for job in due:
                self.term_at[job.id] = float("inf")  # sent once
                self.state.after_commit(partial(self.seam.signal_job, job, signal.SIGTERM))
