"""The requests that change jobs or the queue: cancel, hold, release, update, drain, resume, stop."""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpusched.core import lifecycle
from gpusched.core.errors import GpuschedError, UsageError
from gpusched.core.models import Job, JobState
from gpusched.core.spec import jobspec
from gpusched.core.spec.begintime import begin_text
from gpusched.core.spec.syntax import MAX_PRIORITY
from gpusched.core.users import user_name
from gpusched.daemon.jobs.requeue import NotNow, preempt_one, requeue_one
from gpusched.daemon.requests import batches, quotas
from gpusched.daemon.requests.request import Request, check_priority, targets
from gpusched.daemon.state import DaemonState, Setup
from gpusched.proc.seam import ProcessSeam


class Refused(Exception):
    """One job of a change that cannot be made (a running job to hold): reported as
    refused while the other jobs named are still changed."""


class Changes:
    def __init__(self, state: DaemonState, setup: Setup, seam: ProcessSeam):
        self.state, self.setup, self.seam = state, setup, seam

    def change(
        self,
        req: Request,
        verb: str,
        apply: Callable[[Job], str],
        allowed: Callable[[], None] = lambda: None,
    ) -> dict[str, Any] | batches.BatchedChange:
        """Apply a change to each job named: what happened to each in "results", and
        why each job that could not be changed was not in "refused" (the client then
        exits 1). allowed: raises if the caller may not make this change at all (asked
        once the jobs are known to be theirs)."""
        jobs = targets(self.state, req.args["ids"])
        self.setup.authz.require_owner(jobs, req.creds, f"{verb} it", req.name)
        allowed()

        def outcome(job: Job) -> tuple[str, bool]:
            try:
                return apply(job), False
            except Refused as exc:
                return str(exc), True

        # Thousands of jobs (a big array) are changed a batch per turn of the loop.
        work = batches.BatchedChange(self.state, jobs, outcome)
        return work if len(jobs) > batches.BIG_JOBS else work.run_all()

    def cancel(self, req: Request) -> dict[str, Any] | batches.BatchedChange:
        who = user_name(req.creds[1])
        return self.change(req, "cancel", lambda job: self._cancel_one(job, who))

    def _cancel_one(self, job: Job, who: str) -> str:
        if job.state.is_final:
            return f"already {job.state.value}"
        if job.id in self.state.remote_ids:  # cancelled in Slurm (daemon/slurm/poll.py)
            return self.state.clusters.cancel(job, who)
        if job.state is JobState.PENDING:
            self.state.save(lifecycle.cancel_unstarted(job, who, self.setup.clock.time()))
            return "cancelled"
        if not job.cancel_requested:
            # Who asked is kept for the end: lifecycle.end_reason adds how the job went.
            self.state.save(replace(job, cancel_requested=True, end_reason=f"cancelled by {who}"))
        # The shim passes SIGTERM to the job's process group and sends SIGKILL after the
        # grace period; its exit record then ends the job as cancelled. A shim being
        # launched, its pid not known yet, gets it once it is (JobControl._found_shim).
        # Only once the cancel is stored: a refused cancel must not stop the job.
        self.state.after_commit(lambda: self.seam.signal_job(job, signal.SIGTERM))
        return "cancelling"

    def hold(self, req: Request) -> dict[str, Any] | batches.BatchedChange:
        return self.change(req, "hold", lambda job: self._set_held(job, True))

    def release(self, req: Request) -> dict[str, Any] | batches.BatchedChange:
        return self.change(req, "release", lambda job: self._set_held(job, False))

    def _set_held(self, job: Job, held: bool) -> str:
        if job.state is not JobState.PENDING:
            raise Refused(f"{job.state.value}; only pending jobs can be held or released")
        self.state.save(replace(job, held=held))
        return "held" if held else "released"

    def update(self, req: Request) -> dict[str, Any] | batches.BatchedChange:
        priority = jobspec.whole_number(req.args, "priority", None, -MAX_PRIORITY, MAX_PRIORITY)
        begin_time = jobspec.checked_begin_time(req.args)
        over = req.args.get("gpu_mem_over")  # checked by the protocol's table
        if priority is None and begin_time is None and over is None:
            raise UsageError(
                "nothing to update; give --priority N, --begin TIME or --gpu-mem-over ACTION"
            )
        changes: dict[str, Any] = {
            "priority": priority,
            "begin_time": begin_time,
            "gpu_mem_over": over,
        }
        changes = {key: value for key, value in changes.items() if value is not None}

        def apply(job: Job) -> str:
            if job.state.is_final:
                raise Refused(
                    f"already {job.state.value}; only pending and running jobs can be updated"
                )
            if begin_time is not None and (
                job.state is not JobState.PENDING or job.id in self.state.remote_ids
            ):
                raise Refused(
                    "--begin changes only pending jobs of this machine's queue, "
                    f"and this one is {job.state.value}"
                    + (" on a cluster" if job.id in self.state.remote_ids else "")
                )
            self.state.save(replace(job, **changes))
            said = [] if priority is None else [f"priority {priority}"]
            said += [] if begin_time is None else [f"begin {begin_text(begin_time)}"]
            return ", ".join(said + ([] if over is None else [f"gpu_mem_over {over}"]))

        def allowed() -> None:
            if priority is not None:
                check_priority(self.setup, req.creds, priority)

        return self.change(req, "update", apply, allowed)

    def requeue(self, req: Request) -> dict[str, Any] | batches.BatchedChange:
        def one(job: Job, now: float, who: str) -> str:
            if job.state.is_final:  # back among its owner's queued jobs: within their quota
                try:
                    self.state.jobs.check(
                        job.uid,
                        job.user,
                        1,
                        quotas.job_bytes(job),
                        self.setup.settings,
                        "requeueing it",
                        now,
                    )
                except GpuschedError as exc:
                    raise NotNow(exc.message) from None
            return requeue_one(self.state, self.seam, job, now, who)

        return self._requeueing(req, "requeue", one)

    def preempt(self, req: Request) -> dict[str, Any] | batches.BatchedChange:
        signum = self.setup.settings.preempt_signal
        return self._requeueing(
            req,
            "preempt",
            lambda job, now, who: preempt_one(self.state, self.seam, job, now, who, signum),
        )

    def _requeueing(
        self, req: Request, verb: str, one: Callable[[Job, float, str], str]
    ) -> dict[str, Any] | batches.BatchedChange:
        """A job back in the queue under its id (daemon/jobs/requeue.py), for its owner or an admin."""
        who = user_name(req.creds[1])

        def apply(job: Job) -> str:
            try:
                return one(job, self.setup.clock.time(), who)
            except NotNow as exc:
                raise Refused(str(exc)) from None

        return self.change(req, verb, apply)

    def drain(self, req: Request) -> dict[str, Any]:
        return self._set_draining(req, True)

    def resume(self, req: Request) -> dict[str, Any]:
        return self._set_draining(req, False)

    def _set_draining(self, req: Request, draining: bool) -> dict[str, Any]:
        self.setup.authz.require_admin(req.creds, req.name, "drain or resume the queue")
        self.state.set_draining(draining)
        return {"draining": draining, "running": len(self.state.running())}

    def stop(self, req: Request) -> dict[str, Any]:
        self.setup.authz.require_admin(req.creds, "stop", "stop the daemon", root_only=True)
        self.state.note_stopping()
        return {"stopping": True, "running_jobs_left": len(self.state.running())}
