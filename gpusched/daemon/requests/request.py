"""A request as the handlers see it, the jobs its ids name, and a `wait` answered later."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpusched.core.errors import NotFound, PermissionDenied, UsageError
from gpusched.core.models import Job
from gpusched.core.spec import syntax
from gpusched.daemon.state import DaemonState, Setup

# A `wait` request is answered after this long at most; the client simply asks again.
WAIT_SLICE_S = 30.0


@dataclass(frozen=True)
class Request:
    name: str
    args: dict[str, Any]
    creds: tuple[int, int, int]  # (pid, uid, gid) of the caller, from SO_PEERCRED


class Waiter:
    """A `wait` whose jobs still run: the loop answers it with result() once every job it
    names has ended, or at its deadline (a monotonic time), whichever comes first."""

    def __init__(
        self,
        ids: list[int],
        result: Callable[[], dict[str, Any]],
        deadline: float,
        never_starts: Callable[[int], str | None] | None = None,
    ):
        self.ids, self.result, self.deadline = ids, result, deadline
        self._ended = 0  # how many of the leading ids are known to have ended
        # A job id -> why it can never start (None: it may): a `wait` that is not told
        # to keep waiting is answered at once for the first such job.
        self.never_starts = never_starts

    def ready(self, active: Mapping[int, Job]) -> bool:
        """Whether to answer now: every job named has ended, or the first that has not can
        never start (a dependency that failed), which a waiting script must hear at once."""
        return self.all_ended(active) or self.stuck() is not None

    def stuck(self) -> tuple[int, str] | None:
        """(id, why) of the first job not ended that can never start, if it cannot."""
        if self.never_starts is None or self._ended == len(self.ids):
            return None
        job_id = self.ids[self._ended]
        why = self.never_starts(job_id)
        return None if why is None else (job_id, why)

    def all_ended(self, active: Mapping[int, Job]) -> bool:
        """Whether every job named has ended (left the active jobs)."""
        # An ended job stays ended: step past each once, so that waiting on thousands
        # of jobs (which mostly end in order) costs next to nothing per pass.
        while self._ended < len(self.ids) and self.ids[self._ended] not in active:
            self._ended += 1
        return self._ended == len(self.ids)


def find_job(state: DaemonState, job_id: Any, known: Mapping[int, Job] | None = None) -> Job:
    """The job with this id; `known`: jobs read for this request already (_stored)."""
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        raise UsageError(f"job ids are whole numbers, not {job_id!r}")
    job = known.get(job_id) if known else None
    job = job or state.find(job_id)
    if job is None:
        raise NotFound(f"no job {job_id}; `gpusched ls --all` lists the jobs")
    return job


def named(
    state: DaemonState, item: Any, whole_arrays: bool, known: Mapping[int, Job] | None = None
) -> list[Job]:
    """The jobs an id names: ID, or ARRAY_INDEX (12_3) for one element of array 12.
    With whole_arrays, an array's id names every element (the commands that change
    jobs, and wait); otherwise the one job with that id (show, logs, env)."""
    base, index = syntax.parse_job_id(item)
    job = find_job(state, base, known)
    if index is None:
        if whole_arrays and job.array_id == job.id:
            # The active elements from memory: decoding 100,000 rows would hold the loop
            # for seconds. Only ended ones are read from the store.
            ids = state.store.array_ids(job.id)
            stored = state.store.many([i for i in ids if i not in state.jobs])
            return [state.jobs.get(i) or stored[i] for i in ids]
        return [job]
    if job.array_id != job.id:
        raise NotFound(f"job {base} is not an array, so {base}_{index} names no job")
    for element in state.store.array(base):
        if element.array_index == index:
            return [state.jobs.get(element.id, element)]
    raise NotFound(f"array {base} has no element {index}")


def named_each(state: DaemonState, ids: Any, whole_arrays: bool) -> list[Job]:
    """Every job the ids name, each once, in the order named."""
    if not isinstance(ids, list) or not ids:
        raise UsageError("give at least one job id")
    out: dict[int, Job] = {}
    known = _stored(state, ids)
    for item in ids:
        for job in named(state, item, whole_arrays, known):
            out.setdefault(job.id, job)
    return list(out.values())


def _stored(state: DaemonState, ids: list[object]) -> dict[int, Job]:
    """The ended jobs among plain ids, read in one query: a `wait` on a sweep's 1,000
    ended jobs made 1,000 queries. Ids of a submit being stored are left to state.find."""
    wanted = [
        i
        for i in ids
        if type(i) is int
        and i not in state.jobs
        and not any(i in incoming for incoming in state.incoming)
    ]
    return state.store.many(wanted) if len(wanted) > 1 else {}


def targets(state: DaemonState, ids: Any) -> list[Job]:
    """Jobs named for a change: an id, an array's id (every element), or ARRAY_INDEX."""
    return sorted(named_each(state, ids, whole_arrays=True), key=lambda j: j.id)


def check_priority(setup: Setup, creds: tuple[int, int, int], priority: int) -> None:
    """Refuse a priority above scheduling.max_user_priority from one who is not an admin:
    a higher one jumps other users' jobs and preempts their preemptible ones (as Slurm,
    raising a job's priority is the operators')."""
    cap = setup.settings.max_user_priority
    if priority > cap and not setup.authz.is_admin(creds[1]):
        raise PermissionDenied(
            f"priority {priority} is over {cap}, the highest a user who is "
            "not an admin may give (scheduling.max_user_priority in the "
            "daemon's config); give a lower one, or ask an admin"
        )
