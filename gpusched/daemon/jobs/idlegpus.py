"""Idle GPUs held by jobs: a running job whose GPUs all stayed at 0% busy past [idle] after
is flagged (ls, show, top, /metrics) and, by [idle] action, warned, cancelled or requeued."""

from __future__ import annotations

import logging
import signal
from collections.abc import Mapping
from dataclasses import replace

from gpusched.core.config import Settings
from gpusched.core.models import Inventory, Job
from gpusched.core.units import duration_human
from gpusched.daemon.jobs import requeue
from gpusched.daemon.state import DaemonState, Setup
from gpusched.proc.seam import ProcessSeam

log = logging.getLogger("gpusched.idle")


def track(
    inventory: Inventory, running: list[Job], since: Mapping[int, float], now: float
) -> dict[int, float]:
    """Since when each running GPU job's GPUs have all shown 0% busy. A GPU whose
    utilization is unknown, or that is missing from the reading, is never taken for idle."""
    util = {gpu.uuid: gpu.util_pct for gpu in inventory.schedulable()}
    out = {}
    for job in running:
        if job.gpu_uuids and all(util.get(uuid) == 0 for uuid in job.gpu_uuids):
            out[job.id] = since.get(job.id, now)
    return out


def flagged_since(state: DaemonState, settings: Settings, job_id: int, now: float) -> float | None:
    """When the job's GPUs went idle, if that is longer than [idle] after ago; else None."""
    if settings.idle_after_s is None:
        return None
    since = state.gpu_idle_since.get(job_id)
    return since if since is not None and now - since >= settings.idle_after_s else None


def is_subject(job: Job, all_jobs: bool) -> bool:
    """Whether [idle] action may touch the job: never an --interactive one; a
    preemptible one, or any when all_jobs."""
    return not job.interactive and (all_jobs or job.preemptible)


class IdleGpus:
    """After each GPU reading: keep the idle times, and act once on each job newly idle."""

    def __init__(self, state: DaemonState, setup: Setup, seam: ProcessSeam):
        self.state, self.setup, self.seam = state, setup, seam
        self.acted: set[int] = set()  # jobs already warned or stopped in this idle spell

    def step(self, now: float) -> None:
        settings = self.setup.settings
        if settings.idle_after_s is None:
            return
        state = self.state
        state.note_gpu_idle_since(
            track(state.inventory, state.running(), state.gpu_idle_since, now)
        )
        self.acted &= state.gpu_idle_since.keys()  # busy again: a later spell counts anew
        due = [
            job
            for job in state.running()
            if job.id not in self.acted and flagged_since(state, settings, job.id, now) is not None
        ]
        for job in due:
            self.acted.add(job.id)
            self.act(job, now - state.gpu_idle_since[job.id])

    def act(self, job: Job, idle_s: float) -> None:
        settings = self.setup.settings
        action = settings.idle_action if is_subject(job, settings.idle_all_jobs) else "warn"
        what = (
            f"job {job.id}'s GPUs have all been 0% busy for {duration_human(idle_s)} "
            f"([idle] after = {duration_human(settings.idle_after_s)})"
        )
        log.info("%s: %s", what, action)
        if action == "warn":
            self.seam.append_to_log(job.stderr_path, what, job.uid)  # it adds "gpusched: "
        elif action == "cancel":
            self.cancel(job, what)
        elif action == "requeue":
            # The preemption's path: its checkpoint signal and grace, then back to the
            # queue under its id, where it waits like any pending job.
            requeue.stop_and_requeue(
                self.state,
                self.seam,
                job,
                self.setup.clock.time(),
                f"requeued for idle GPUs ({what})",
                requeue.checkpoint_signal(job, settings.preempt_signal),
                job.preempt_grace_s,
            )

    def cancel(self, job: Job, what: str) -> None:
        """Stop the job as `cancel` would; it ends cancelled, saying why."""
        if job.cancel_requested:
            return
        with self.state.write():
            self.state.save(
                replace(
                    job,
                    cancel_requested=True,
                    end_reason=f"cancelled for idle GPUs ({what}; [idle] action = cancel)",
                )
            )
            self.state.after_commit(lambda: self.seam.signal_job(job, signal.SIGTERM))
