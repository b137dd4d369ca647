"""The requests `requeue` (as `scontrol requeue`) and `preempt` (requeue after the checkpoint
signal and grace), for a job's owner or an admin; daemon/requeue.py does the work."""

from __future__ import annotations

import signal
import time

from gpusched.core.models import Job, JobState
from gpusched.daemon import requeue
from gpusched.daemon.authz import user_name
from gpusched.daemon.changes import Changes, Refused
from gpusched.daemon.request import Request


def checkpoint_signal(job: Job, configured: str) -> int:
    """The signal a job gets to checkpoint before it is stopped: its own --signal's, else
    the configured one ([preemption] signal)."""
    if job.warn_signal is not None:
        return job.warn_signal
    return int(getattr(signal, f"SIG{configured}"))


def _when(now: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))


class RequeueCommands:
    def __init__(self, changes: Changes):
        self.changes = changes
        self.state, self.setup, self.seam = changes.state, changes.setup, changes.seam

    def requeue(self, req: Request) -> dict:
        """A running job stopped now (SIGTERM, then SIGKILL after the cancel grace) and
        queued again; an ended one queued again; a pending one refused."""
        who = user_name(req.creds[1])
        return self.changes.change(req, "requeue", lambda job: self._requeue_one(job, who))

    def _requeue_one(self, job: Job, who: str) -> str:
        now = self.setup.clock.time()
        reason = f"requeued by {who} at {_when(now)}"
        if job.state is JobState.PENDING:
            raise Refused("pending; only running and ended jobs can be requeued")
        if job.state.is_final:
            requeue.requeue_ended(self.state, job, reason)
            return "requeued"
        if job.requeueing:
            return "already being requeued"
        requeue.stop_and_requeue(self.state, self.seam, job, now, reason)
        return "stopping; it goes back to the queue when it ends"

    def preempt(self, req: Request) -> dict:
        """A running job sent its checkpoint signal, given its grace, stopped and queued
        again: a preemption now, whatever waits."""
        who = user_name(req.creds[1])
        return self.changes.change(req, "preempt", lambda job: self._preempt_one(job, who))

    def _preempt_one(self, job: Job, who: str) -> str:
        if not job.is_running:
            raise Refused(f"{job.state.value}; only running jobs can be preempted")
        if job.requeueing:
            return "already being requeued"
        now = self.setup.clock.time()
        signum = checkpoint_signal(job, self.setup.settings.preempt_signal)
        requeue.stop_and_requeue(self.state, self.seam, job, now,
                                 f"preempted by {who} at {_when(now)}", signum=signum,
                                 grace_s=job.preempt_grace_s)
        return (f"preempting: {signal.Signals(signum).name} now, SIGTERM in "
                f"{job.preempt_grace_s:g}s unless it ends first; then it goes back to the queue")
