"""Which running jobs' run files a pass reads: those whose end was reported, not every one.

A job's end reaches the daemon as a wake-up datagram sent from an address named for its
run (runfile.end_address): its shim's, or the job supervisor's for a job it started. So a
pass need not read the run file of every running job to find the ends (with 4 jobs
running and one ending at a time, that was four reads for one end); it reads:

- the run files of the runs whose end was reported since the last pass;
- those of jobs whose watched process is not known yet (its pid comes with the
  supervisor's acknowledgement of the start, seam.started, and from the run file when
  none came: a supervisor of a version before them, a daemon restarted since) when
  something waits for the pid: a cancel or a requeue to pass on
  (JobControl._found_shim), a time limit to enforce, GPUs whose processes are told apart
  by it (read_gpus); until the first read that finds it. A plain job with none of these
  learns its pid at its end's read, or at the liveness check;
- every running job's, on a plain wake-up that names no run (a runner that could not
  bind its end address), and on the liveness check that runs
  every GPU poll interval (the loop's `check_liveness`): an end whose report was lost (a
  full wake socket) is found there, a poll interval later at most.
"""

from __future__ import annotations

import queue
from collections.abc import Iterable

from gpusched.core import lifecycle
from gpusched.core.models import Job

_EVERY = -1  # on the queue: a wake-up that names no run, so every run file is read


class RunReads:
    """Reported ends, from the wake socket's thread; taken by the loop's passes."""

    def __init__(self) -> None:
        self._reported: queue.SimpleQueue[int] = queue.SimpleQueue()

    def reported(self, run: str | None) -> None:
        """A wake-up: `run` is the run token of the end it reports, None when it names none."""
        job_id, _, _ = (run or "").partition(".")
        self._reported.put(int(job_id) if job_id.isdigit() else _EVERY)

    def take(self) -> set[int] | None:
        """The ids of jobs whose end was reported since the last take; None: read every
        running job's run file (a wake-up named none)."""
        ids: set[int] = set()
        while not self._reported.empty():
            ids.add(self._reported.get_nowait())
        return None if _EVERY in ids else ids

    def put_back(self, ids: set[int] | None) -> None:
        """What a pass took but did not store (its commit failed): read on the next one."""
        for job_id in (_EVERY,) if ids is None else ids:
            self._reported.put(job_id)


def to_read(
    running: Iterable[Job], reported: set[int] | None, read_all: bool, also: set[int]
) -> list[Job]:
    """The running jobs whose run file this pass reads (see the module's docstring);
    `also`: ids read whatever else holds (launch failures, leftovers being stopped)."""
    if read_all or reported is None:
        return list(running)
    return [
        job
        for job in running
        if job.id in reported or job.id in also or (job.runner_pid is None and _awaits_pid(job))
    ]


def _awaits_pid(job: Job) -> bool:
    """Whether something waits for the pid of a job being launched (see the docstring)."""
    return bool(
        job.cancel_requested
        or job.requeueing
        or job.gpu_indices
        or lifecycle.next_limit_action(job) is not None
    )
