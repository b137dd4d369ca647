"""`ls` on a long queue: the running jobs, the first pending ones, and the rest counted by
array or by name, so that a queue of 100,000 is listed as fast as an empty one.

A plain `ls` sends "pending_rows" (cli/views/lsview.py's LS_PENDING_ROWS); `ls --all` and
`--last` list every job they select (streamed, client/pagedreplies.py). No row, progress or
pending reason is worked out for a job that is only counted. `top`'s snapshot reads the
queue here too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from operator import attrgetter
from typing import Any

from gpusched.core import jobfilter
from gpusched.core.models import Job
from gpusched.daemon.requests.authz import Viewer
from gpusched.daemon.state import DaemonState

# The largest groups a summary names; the others are only counted (a queue of 100,000
# one-off names must not make the reply as long as the listing it stands for).
GROUPS_SENT = 10
# The pending jobs a `top` snapshot carries (the first in its order): a tall screenful.
TOP_PENDING_ROWS = 100
_by_id = attrgetter("id")


def pending_head(state: DaemonState, count: int) -> list[Job]:
    """The first `count` pending jobs of this machine's queue in id order, the order `ls`
    lists them in. (With pending_groups(), all `ls` reads of the pending queue: a queue
    kept in order, with its counts, can answer both without a look at every job.)"""
    return list(state.of_pending(("head", count), lambda: _first_by_id(state, count)))


def _first_by_id(state: DaemonState, count: int) -> list[Job]:
    # Sorting the ids (in C, and nearly sorted already) beats heapq's loop in Python.
    return [state.jobs[i] for i in sorted(state.pending_ids())[:count]]


def pending_top(state: DaemonState, count: int) -> list[Job]:
    """The first `count` pending jobs in the order placement considers them (priority,
    then age), as `top` lists them."""
    return list(state.of_pending(("top", count), lambda: _first_by_priority(state, count)))


def _first_by_priority(state: DaemonState, count: int) -> list[Job]:
    # As held: a template answers the priority (daemon/jobs/jobtable.py).
    pending = state.pending_alike()
    if len({job.priority for _, job in pending}) > 1:
        first = sorted((-job.priority, job_id) for job_id, job in pending)[:count]
        return [state.jobs[job_id] for _, job_id in first]
    return pending_head(state, count)  # the usual queue, one priority: the ids, sorted in C


def pending_count(state: DaemonState, uid: int | None = None) -> int:
    """How many jobs wait in this machine's queue (of one user's, with uid)."""
    if uid is None:
        return state.pending_count()
    return sum(count for count, first in pending_groups(state).values() if first.uid == uid)


def pending_groups(state: DaemonState) -> dict[Any, list[Any]]:
    """Every pending job of this machine's queue counted by group (its array, else its
    owner and name): group key -> [count, its first job]."""
    return state.of_pending("groups", lambda: count_groups(state.pending_alike(), state.jobs))


def group_of(job: Job, name: str) -> Any:
    """The group a pending job is counted in: its array, else its owner's jobs of its name."""
    return job.array_id if job.array_id is not None else (job.uid, name)


def count_groups(
    pending: Iterable[tuple[int, Job]], jobs: Mapping[int, Job]
) -> dict[Any, list[Any]]:
    """group key -> [count, its first job] of (id, job or its template) pairs: a template
    answers the group (daemon/jobs/jobtable.py); only each group's first job is built, from jobs."""
    groups: dict[Any, list[int]] = {}  # [count, its first id]
    for job_id, job in pending:
        key = group_of(job, job.display_name)
        if key in groups:
            group = groups[key]
            group[0] += 1
            if job_id < group[1]:
                group[1] = job_id
        else:
            groups[key] = [1, job_id]
    return {key: [count, jobs[first]] for key, (count, first) in groups.items()}


def head(
    state: DaemonState, viewer: Viewer, args: dict[str, Any], shown: int
) -> tuple[list[Job], dict[str, Any] | None]:
    """The active jobs a plain `ls` looks at, in id order: every one not pending here (the
    running ones, cluster jobs) and the first `shown` pending ones that pass the filters;
    and the summary of the matching pending jobs left over (None when none are)."""
    others = state.running() + [job for i in state.remote_ids if (job := state.jobs.get(i))]
    if any(args.get(key) for key in ("users", "states", "names")):
        passes = jobfilter.matcher(args)
        pending = sorted(
            (job_id, job)
            for job_id, job in state.pending_alike()
            if passes(job.user, job.state.value, viewer.name_of(job))
        )
        first = [state.jobs[job_id] for job_id, _ in pending[:shown]]
        groups = count_groups(pending[shown:], state.jobs)
    else:
        first = pending_head(state, shown)
        groups = _without(pending_groups(state), first) if len(first) == shown else {}
    jobs = sorted(others + first, key=_by_id)
    return jobs, (summary(groups, viewer) if groups else None)


def _without(groups: dict[Any, list[Any]], shown: list[Job]) -> dict[Any, list[Any]]:
    """The groups less the jobs shown (a group keeps its first job for its name)."""
    left = dict(groups)  # the cached counts stay as they are: only changed groups are new
    for job in shown:
        key = group_of(job, job.display_name)
        count, first = left[key]
        if count == 1:
            del left[key]
        else:
            left[key] = [count - 1, first]
    return left


def summary(groups: dict[Any, list[Any]], viewer: Viewer) -> dict[str, Any]:
    """How many jobs, and the largest groups among them, largest first (ties: the group
    with the lowest id first); the rest counted as others, in other groups."""
    visible: dict[Any, list[Any]] = {}  # another user's names are hidden: those groups merge
    for count, first in groups.values():
        group = visible.setdefault(group_of(first, viewer.name_of(first)), [0, first])
        group[0] += count
        group[1] = min(group[1], first, key=_by_id)
    largest = sorted(visible.values(), key=lambda g: (-g[0], g[1].id))[:GROUPS_SENT]
    total = sum(count for count, _ in visible.values())
    return {
        "count": total,
        "groups": [
            {
                "count": count,
                "array_id": first.array_id,
                "user": first.user,
                "name": viewer.name_of(first),
            }
            for count, first in largest
        ],
        "others": total - sum(count for count, _ in largest),
        "other_groups": len(visible) - len(largest),
    }
