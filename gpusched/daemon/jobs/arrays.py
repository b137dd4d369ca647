"""Arrays as a whole: each element's view of its array (Slurm's SLURM_ARRAY_TASK_COUNT, _MIN,
_MAX and _STEP, read from the queue once per array), and an array's end as a dependency."""

from __future__ import annotations

from typing import Any

from gpusched.core.models import Job, JobState
from gpusched.proc import jobenv

# Arrays remembered at once: enough for every array that can be starting, small in memory.
_ARRAYS_KEPT = 256


class ArrayShapes:
    """The array variables of elements as they start, one store read per array."""

    def __init__(self, store: Any):
        self.store = store
        self._by_array: dict[int, dict[str, str]] = {}

    def environment(self, job: Job) -> dict[str, str]:
        if job.array_id is None:
            return {}
        env = self._by_array.get(job.array_id)
        if env is None:
            indices = [
                j.array_index for j in self.store.array(job.array_id) if j.array_index is not None
            ]
            env = jobenv.array_environment(indices or [job.array_index or 0])
            if len(self._by_array) >= _ARRAYS_KEPT:
                self._by_array.pop(next(iter(self._by_array)))  # the oldest
            self._by_array[job.array_id] = env
        return env


def array_ended_as(array_id: int, elements: list[Job]) -> str:
    """How an ended array ended, naming its first element that did not succeed."""
    failed = next(
        (j for j in elements if j.state.is_final and j.state is not JobState.SUCCEEDED), None
    )
    if failed is None:
        return f"every element of array {array_id} succeeded"
    return f"element {array_id}_{failed.array_index} (job {failed.id}) ended {failed.state.value}"


def array_state(states: list[JobState]) -> JobState:
    """A dependency on an array means on all of it, as in Slurm: it has ended when every
    element has, and it succeeded only if every element did; it has started (`after`)
    when no element is pending."""
    if any(s is JobState.PENDING for s in states):
        return JobState.PENDING
    if not all(s.is_final for s in states):
        return JobState.RUNNING
    return JobState.SUCCEEDED if all(s is JobState.SUCCEEDED for s in states) else JobState.FAILED
