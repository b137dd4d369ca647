"""What the pending jobs' dependencies need to know, looked up as a pass asks for it: the
states of the jobs and arrays they name, the elements aftercorr pairs them with, and the
active jobs of the same user and name for singleton (core/sched/dependencies.py decides). A pass
that stops early never reads what the jobs it did not reach depend on."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from gpusched.core.models import Job, JobState
from gpusched.core.sched.dependencies import DependencyStates, SameName
from gpusched.daemon.jobs.arrays import array_ended_as, array_state

if TYPE_CHECKING:
    from gpusched.daemon.jobs.jobtable import JobTable


class DependencyLookup(DependencyStates):
    """DependencyStates filled on demand, for one pass: a job id's state (an array's id:
    the whole array's, as array_state says) from the active jobs, else the store."""

    def __init__(self, active: JobTable, store: Any):
        super().__init__()
        self._active, self._store = active, store
        self.elements = _Elements(self)
        self.same_name = _SameName(active)

    def get(self, job_id: int, default: Any = None) -> Any:
        if job_id not in self:
            self.fill(job_id)
        return super().get(job_id, default)

    def __getitem__(self, job_id: int) -> JobState:
        if job_id not in self:
            self.fill(job_id)
        return super().__getitem__(job_id)

    def fill(self, job_id: int) -> None:
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
            self.elements.update(((job_id, j.array_index), j.state) for j in current)


class _Elements(dict[tuple[int, int], JobState]):
    """(array id, index) -> state, for aftercorr: an array's elements are read with it."""

    def __init__(self, lookup: DependencyLookup):
        super().__init__()
        self._lookup = lookup

    def get(self, key: tuple[int, int], default: Any = None) -> Any:
        if key[0] not in self._lookup:
            self._lookup.fill(key[0])
        return super().get(key, default)


class _SameName:
    """(uid, name) -> ((job id, state), ...): the lowest started and the lowest pending of
    the active jobs of that user and name, all that singleton needs. Worked out in one walk
    of the active jobs, the first time a singleton is reached in a pass (a queue may hold a
    100,000-element array of one name)."""

    def __init__(self, active: JobTable):
        self._active = active
        self._lowest: dict[tuple[int, str], tuple[tuple[int, JobState], ...]] | None = None

    def get(self, key: tuple[int, str], default: SameName = (), /) -> SameName:
        if self._lowest is None:
            # As held: a template answers uid and name (daemon/jobs/jobtable.py).
            self._lowest = lowest_by_name(self._active.alike())
        return self._lowest.get(key, default)


def lowest_by_name(
    active: Iterable[tuple[int, Job]],
) -> dict[tuple[int, str], tuple[tuple[int, JobState], ...]]:
    """(uid, name) -> the lowest started and lowest pending (job id, state) of these
    (job id, job) pairs."""
    lowest: dict[tuple[int, str], dict[bool, tuple[int, JobState]]] = {}
    for job_id, job in active:  # every job that has not ended is active
        kept = lowest.setdefault((job.uid, job.display_name), {})
        started = job.state is not JobState.PENDING
        if started not in kept or job_id < kept[started][0]:
            kept[started] = (job_id, job.state)
    return {key: tuple(kept.values()) for key, kept in lowest.items()}
