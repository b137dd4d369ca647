"""When pending jobs may first start (a --begin time, a retry's delay, a reservation's start
or end), earliest first: the loop's one timer for all."""

from __future__ import annotations

import heapq

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from gpusched.core.models import Job


class StartTimes:
    """Pending jobs that may not start before a time still to come. The loop waits until the earliest
    (next), not a poll, and runs a pass once one is due (take_due). A heap with entries
    left behind by changes, skipped as they come up: a change costs O(log n), not a scan."""

    def __init__(self, time: Callable[[], float]):
        self._time = time
        self._when: dict[int, float] = {}  # job id -> its begin time: the truth
        self._heap: list[tuple[float, int]] = []
        # Times that are no job's, by what they belong to (a reservation's name): a few.
        self._other: dict[str, tuple[float, ...]] = {}

    def note(self, job_id: int, job: Job | None) -> None:
        """A job as it now is (None: no longer pending, or no longer active)."""
        when = None if job is None else _may_start_at(job)
        if when is None or when <= self._time():
            self._when.pop(job_id, None)
        elif self._when.get(job_id) != when:
            self._when[job_id] = when
            heapq.heappush(self._heap, (when, job_id))

    def note_times(self, key: str, times: list[float]) -> None:
        """The times to come of something not a job (a reservation's start and end, by its
        name), at which a pass may decide otherwise; none forgets them."""
        now = self._time()
        later = tuple(sorted(when for when in times if when > now))
        if later:
            self._other[key] = later
        else:
            self._other.pop(key, None)

    def next(self) -> float | None:
        """The earliest such time to come (epoch s), or None."""
        heap = self._heap
        while heap and self._when.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        first = heap[0][0] if heap else None
        other = min((times[0] for times in self._other.values()), default=None)
        return other if first is None or (other is not None and other < first) else first

    def take_due(self, now: float) -> bool:
        """Whether such a time has come since the last call: a pass may start its job."""
        due = False
        while (when := self.next()) is not None and when <= now:
            due = True
            if self._heap and self._heap[0][0] == when:
                del self._when[heapq.heappop(self._heap)[1]]
            else:
                for key in [k for k, times in self._other.items() if times[0] == when]:
                    self.note_times(key, [t for t in self._other[key] if t > when])
        return due


def _may_start_at(job: Job) -> float | None:
    """The later of the job's --begin time and the end of its retry delay (None: either)."""
    times = [when for when in (job.begin_time, job.eligible_at) if when is not None]
    return max(times) if times else None
