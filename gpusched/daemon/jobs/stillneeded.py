"""What the active jobs still need of the finished ones, for retention's sweeps: the ids they
depend on and the arrays with active elements, kept up to date without a look at every
active job each turn (with 100,000 pending, that look alone took about 50 ms a turn).

A sweep's index looks at the active jobs once, CHUNK_JOBS a turn, and then at each job
that becomes active after (a submit, an ended job queued again: DaemonState tells it). It
only grows during the sweep: a job that leaves keeps what it needed until the next sweep,
which errs on the side of keeping. Nothing is removed until it has caught up.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Iterator

from gpusched.core.models import Job
from gpusched.core.spec.syntax import dependency_job_ids
from gpusched.daemon.state import DaemonState

CHUNK_JOBS = 5000  # active jobs looked at per turn at most: a few ms


class Needed:
    """The finished jobs that active jobs need: depended_on (ids) and busy_arrays."""

    def __init__(self, state: DaemonState):
        self.state = state
        self.depended_on: set[int] = set()
        self.busy_arrays: set[int] = set()
        self._todo: deque[Iterable[Job]] = deque()  # jobs not looked at yet
        self._current: Iterator[Job] | None = None
        self.watching = False

    def start(self) -> None:
        """From now on: every active job, and each one that becomes active after."""
        # As held: a sweep's pending jobs share one template, which answers both (and
        # once: daemon/jobs/jobtable.py); a list, since the table changes during the sweep.
        self._look_later([entry for _, entry in self.state.jobs.alike()])
        self.state.tell_activated(self._look_later)
        self.watching = True

    def _look_later(self, jobs: Iterable[Job]) -> None:
        """Jobs (or the templates they are held by) to look at in a later chunk."""
        self._todo.append(_distinct(jobs))

    def stop(self) -> None:
        if self.watching:
            self.state.tell_activated(self._look_later, told=False)
            self.watching = False
        self._todo.clear()
        self._current = None

    def catch_up(self) -> bool:
        """Look at up to CHUNK_JOBS jobs not looked at yet; whether none is left."""
        left = CHUNK_JOBS
        while left:
            if self._current is None:
                if not self._todo:
                    return True
                self._current = iter(self._todo.popleft())
            seen = 0
            for job in itertools.islice(self._current, left):
                seen += 1
                self.depended_on.update(dependency_job_ids(job.dependencies))
                if job.array_id is not None:
                    self.busy_arrays.add(job.array_id)
            if seen < left:  # that list is done
                self._current = None
            left -= seen
        return False


def _distinct(entries: Iterable[Job]) -> Iterator[Job]:
    """The entries, less each one that is the very object just before it."""
    last = None
    for entry in entries:
        if entry is not last:
            last = entry
            yield entry
