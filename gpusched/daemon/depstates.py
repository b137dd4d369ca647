"""The states of the jobs that pending jobs depend on, looked up as a pass asks for them:
a pass that stops early never reads those of the jobs it did not reach."""

from __future__ import annotations

from typing import Any

from gpusched.core import scheduling
from gpusched.core.models import JobState
from gpusched.daemon.arrays import array_ended_as, array_state


class DependencyLookup(scheduling.DependencyStates):
    """scheduling.DependencyStates filled on demand: a job id's state (an array's id: the
    whole array's, as array_state says) from the active jobs, else the store."""

    def __init__(self, active: dict[int, Any], store: Any):
        super().__init__()
        self._active, self._store = active, store

    def get(self, job_id: int, default: Any = None) -> Any:
        if job_id not in self:
            self._fill(job_id)
        return super().get(job_id, default)

    def __getitem__(self, job_id: int) -> JobState:
        if job_id not in self:
            self._fill(job_id)
        return super().__getitem__(job_id)

    def _fill(self, job_id: int) -> None:
        job = self._active.get(job_id)
        if job is not None:
            self[job_id] = job.state
        else:
            self[job_id] = self._store.states([job_id]).get(job_id)  # None: no such job
        elements = self._store.array(job_id)
        if len(elements) > 1:
            current = [self._active.get(j.id, j) for j in elements]
            self[job_id] = array_state([j.state for j in current])
            self.ended_as[job_id] = array_ended_as(job_id, current)

