"""The pending jobs in the order a scheduling pass considers them, kept in step one job at a
time (a pass never sorts the queue), and the counts a bounded pass needs.

A queue of 100,000 jobs is mostly a few kinds of job: a pass stops once every kind left in
line is known to be unable to start (core/sched/scheduling.py), which needs how many of each
kind remain: `shapes`. Each kind has its own line, so that a pass passes over all the jobs
of a kind it refused at once (Walk). The daemon (daemon/state.py) and the simulator keep
one queue each.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Iterator, Mapping
from operator import itemgetter
from typing import Any

from gpusched.core.models import Job
from gpusched.core.spec.syntax import MAX_JOB_ID, SINGLETON


def shape_of(job: Job, per_user: bool = True) -> tuple[Any, ...]:
    """What decides whether a pass can start a job, besides its place in line and its
    time limit: two jobs of one shape that a pass refuses for want of GPUs, cores, memory
    or a limit, or for a hold or a dependency, are refused alike. (The time limit matters
    only to backfill's promise, which a pass never takes as final: scheduling._consider;
    and whether there is one, to GPU reservations.)
    The user counts only where per-user limits are set. Two dependency kinds are decided
    by more than the dependency itself: singleton by the job itself (of one user's jobs of
    a name, the oldest active one goes first: a later one waits, the oldest may not),
    aftercorr by its array index."""
    return (
        job.request,
        job.policy,
        job.user if per_user else "",
        job.held,
        job.dependencies,
        job.kill_on_invalid_dep,
        job.eligible_at,
        job.begin_time,
        # GPU reservations close GPUs to a job by its --time (core/sched/reservations.py):
        # alike to all jobs without one.
        job.reservation,
        job.time_limit_s is None,
        job.array_id if job.array_throttle is not None else None,
        job.array_throttle,
        job.id if job.preempt_hold else None,
        _decided_by(job) if job.dependencies else None,
    )


def _decided_by(job: Job) -> tuple[int | None, int | None] | None:
    kinds = {kind for kind, _ in job.dependencies}
    if SINGLETON not in kinds and "aftercorr" not in kinds:
        return None
    return (
        job.id if SINGLETON in kinds else None,
        job.array_index if "aftercorr" in kinds else None,
    )


def may_be_cancelled(shape: tuple[Any, ...]) -> bool:
    """Whether a pass may cancel jobs of this shape (--kill-on-invalid-dep and a dependency):
    they are looked at even where the others of their shape need not be."""
    return bool(shape[4]) and shape[5]


# Below fairshare and sjf, a line key is one int, (-priority) * _ID_SPAN + id, ordered as
# (-priority, id) is: with priority 0 it is the job's own id object, and 100,000 waiting
# jobs cost no tuple each. No job has an id past MAX_JOB_ID (a row with one is damaged:
# store/rows.py), so the id is the key's remainder.
_ID_SPAN = MAX_JOB_ID + 1


def line_key(job: Job, discipline: str) -> int | tuple[float, float, int]:
    """A job's place in its user's line: queuerules.order_key, less fair share (the same
    for all of one user's jobs, so the lines are merged by it at each pass)."""
    if discipline == "sjf":
        return (
            -job.priority,
            job.time_limit_s if job.time_limit_s is not None else math.inf,
            job.id,
        )
    return job.id - job.priority * _ID_SPAN if job.priority else job.id


def _drop(counts: dict[int, int], key: int) -> None:
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]


class PendingQueue:
    """The pending jobs as sorted lines of line_key()s, one line per shape (per user and
    shape under fairshare, which weighs each user's share), plus counts by shape. It holds
    keys only: the jobs stay in the caller's table. Shapes are numbered as they first
    appear: a pass counts them by number, never hashing a Request. A line per shape lets a
    pass pass over every job of a refused shape at once (Walk)."""

    def __init__(self, discipline: str, per_user: bool = True):
        self.discipline, self.per_user = discipline, per_user
        # A line's name: its shape's number, or (user, number) under fairshare.
        self._lines: dict[Any, list[Any]] = {}
        # Where each line starts: the jobs that leave a line are mostly at its head, and
        # deleting there would move the whole line (100,000 keys) each time. Absent: 0.
        self._heads: dict[Any, int] = {}
        self.shapes: dict[int, int] = {}  # shape number -> pending jobs of that shape
        # Pending jobs. No table by job id: a pass learns a job's shape from its line, and
        # remove() from the job itself (100,000 entries would cost 5 MB).
        self._size = 0
        self._numbers: dict[tuple[Any, ...], int] = {}  # shape -> its number
        self._shapes: list[tuple[Any, ...] | None] = []  # number -> shape (None: free)
        # Numbers of shapes no job has any more, to give again: jobs with shapes of their
        # own (a chain of dependencies) must not leave one behind each.
        self._free_numbers: list[int] = []

    def __len__(self) -> int:
        return self._size

    def add(self, job: Job) -> None:
        name = self._line_name(job, self._count(job))
        insort(
            self._lines.setdefault(name, []),
            line_key(job, self.discipline),
            self._heads.get(name, 0),
        )

    def add_many(self, jobs: Iterable[Job]) -> None:
        """add() for many jobs: appended, then each line touched sorted once."""
        touched = set()
        for job in jobs:
            name = self._line_name(job, self._count(job))
            if name not in touched:  # sorted whole below: its dropped keys go first
                touched.add(name)
                head = self._heads.pop(name, 0)
                if head:
                    del self._lines[name][:head]
            self._lines.setdefault(name, []).append(line_key(job, self.discipline))
        for name in touched:
            self._lines[name].sort()

    def remove(self, job: Job) -> None:
        """Take out a job as it was added (the same version of it)."""
        shape = self._shape(job)
        number = self._numbers[shape]  # number_of(job)
        self._size -= 1
        name = self._line_name(job, number)
        line, head = self._lines[name], self._heads.get(name, 0)
        key = line_key(job, self.discipline)
        at = bisect_left(line, key, head)
        if at < len(line) and line[at] == key:
            if at == head:
                head += 1
            else:
                del line[at]
        if head == len(line):
            del self._lines[name]
            self._heads.pop(name, None)
        elif head:
            self._trim(name, head)
        _drop(self.shapes, number)
        if number not in self.shapes:
            del self._numbers[shape]
            self._shapes[number] = None
            self._free_numbers.append(number)

    def _trim(self, name: Any, head: int) -> None:
        """Note where a line now starts, dropping the keys before it once they are as many
        as the rest (each key is moved at most once on average)."""
        line = self._lines[name]
        if head * 2 >= len(line):
            del line[:head]
            head = 0
        if head:
            self._heads[name] = head
        else:
            self._heads.pop(name, None)

    def same_place(self, old: Job, new: Job) -> bool:
        """Whether replacing old by new changes neither its place nor its counts (a new
        pending reason, a shim's pid...): most changes to a pending job."""
        return (
            old.user == new.user
            and line_key(old, self.discipline) == line_key(new, self.discipline)
            and self._shape(old) == self._shape(new)
        )

    def shape(self, number: int) -> tuple[Any, ...]:
        shape = self._shapes[number]
        assert shape is not None, f"no pending job has shape {number}"  # asked for live ones
        return shape

    def number_of(self, job: Job) -> int:
        """The number of a queued job's shape (as it was added)."""
        return self._numbers[self._shape(job)]

    def ids(self, share: Callable[[str], float] | None = None) -> Iterator[int]:
        """Job ids in scheduling order, lazily: a pass that stops early reads only the
        head of the line. `share`: each user's fair share (fairshare only)."""
        return map(itemgetter(0), _merged(self, share, set()))

    def jobs(self, table: Mapping[int, Job], share: Callable[[str], float] | None = None) -> Walk:
        """The jobs of `table` (id -> job) in scheduling order, as a Walk."""
        return Walk(self, table, share)

    def _line_name(self, job: Job, number: int) -> Any:
        return (job.user, number) if self.discipline == "fairshare" else number

    def _shape(self, job: Job) -> tuple[Any, ...]:
        return shape_of(job, self.per_user)

    def _count(self, job: Job) -> int:
        shape = self._shape(job)
        number = self._numbers.get(shape)
        if number is None:
            if self._free_numbers:
                number = self._free_numbers.pop()
                self._shapes[number] = shape
            else:
                number = len(self._shapes)
                self._shapes.append(shape)
            self._numbers[shape] = number
        self._size += 1
        self.shapes[number] = self.shapes.get(number, 0) + 1
        return number


class Walk:
    """One pass's reading of a PendingQueue: its jobs in scheduling order, the lines merged
    lazily. Once a shape's number is put in `skipped`, the rest of its jobs are passed over
    at once, line by line, instead of one by one (core/sched/scheduling.py, Bound)."""

    def __init__(
        self, queue: PendingQueue, table: Mapping[int, Job], share: Callable[[str], float] | None
    ):
        self.queue = queue
        self.skipped: set[int] = set()
        self.number = -1  # the shape of the job read last
        self._jobs = self._read(table, _merged(queue, share, self.skipped))

    def __iter__(self) -> Iterator[Job]:
        return self._jobs

    def __next__(self) -> Job:
        return next(self._jobs)

    def _read(self, table: Mapping[int, Job], merged: Iterator[tuple[int, int]]) -> Iterator[Job]:
        for job_id, number in merged:
            self.number = number
            yield table[job_id]


def _merged(
    queue: PendingQueue, share: Callable[[str], float] | None, skipped: set[int]
) -> Iterator[tuple[int, int]]:
    """The ids (with their shape's number) of the queue's lines merged in scheduling order,
    a line dropped when it comes up with its shape in `skipped`. Keys hold their job's id,
    so no two are equal and the order does not depend on how the jobs are split into lines."""
    fairshare = queue.discipline == "fairshare"
    fair = share if fairshare else None  # the users' shares weigh only under fairshare
    lines: list[list[Any]] = []
    positions: list[int] = []
    numbers: list[int] = []
    shares: list[float] = []
    heap: list[tuple[Any, int]] = []
    for name, line in queue._lines.items():
        head = queue._heads.get(name, 0)
        first = line[head]
        if fair is not None:
            user_share = fair(name[0])
            shares.append(user_share)
            heap.append(((first // _ID_SPAN, user_share, first % _ID_SPAN), len(lines)))
        else:
            heap.append((first, len(lines)))
        lines.append(line)
        positions.append(head)
        numbers.append(name[1] if fairshare else name)
    heapq.heapify(heap)
    return _merge_lines(
        heap,
        lines,
        positions,
        numbers,
        shares if fair is not None else None,
        skipped,
        queue.discipline == "sjf",
    )


def _merge_lines(
    heap: list[tuple[Any, int]],
    lines: list[list[Any]],
    positions: list[int],
    numbers: list[int],
    shares: list[float] | None,
    skipped: set[int],
    sjf: bool,
) -> Iterator[tuple[int, int]]:
    """heapq.merge of the lines, less the ones whose shape is skipped. `heap`: each line's
    first sort key and its index; `positions`: where each line starts; `shares`: each
    line's user's share (fairshare)."""
    heappop, heapreplace = heapq.heappop, heapq.heapreplace
    while heap:
        index = heap[0][1]
        if numbers[index] in skipped:
            heappop(heap)  # the rest of this line: refused alike
            continue
        line = lines[index]
        at = positions[index]
        key = line[at]
        at += 1
        if at == len(line):
            heappop(heap)
        else:
            positions[index] = at
            following = line[at]
            if shares is not None:
                following = (following // _ID_SPAN, shares[index], following % _ID_SPAN)
            heapreplace(heap, (following, index))
        yield key[-1] if sjf else key % _ID_SPAN, numbers[index]


class Bound:
    """Within one pass: how many jobs of each shape are still ahead, and which shapes can
    no longer start in it. Resources only get taken during a pass, so a shape refused for
    want of them (or held, or waiting on a dependency) stays refused to the pass's end;
    once every shape still ahead is, nothing behind can start and the pass stops."""

    def __init__(self, queue: PendingQueue, walk: Walk | None = None):
        self.queue, self.walk = queue, walk
        self.left = dict(queue.shapes)
        # Shared with the walk, which then passes over the rest of a blocked shape at once.
        self.blocked: set[int] = walk.skipped if walk is not None else set()
        self.open = len(self.left)  # shapes with jobs ahead that might still start

    def take(self, job: Job) -> int:
        """The next job in line is being considered: its shape's number."""
        shape = self.walk.number if self.walk is not None else self.queue.number_of(job)
        left = self.left[shape] - 1
        self.left[shape] = left
        if left == 0 and shape not in self.blocked:
            self.open -= 1
        return shape

    def block(self, shape: int) -> None:
        """No job of this shape can start in the rest of the pass."""
        if shape not in self.blocked:
            self.blocked.add(shape)
            if self.left[shape] > 0:
                self.open -= 1

    def is_done(self) -> bool:
        return self.open <= 0

    def may_be_cancelled(self, shape: int) -> bool:
        return may_be_cancelled(self.queue.shape(shape))

    def block_all_but_cancels(self) -> None:
        """Block every shape ahead but those whose jobs may be cancelled (max_running is
        reached: nothing starts, but a dependency never met still cancels a job)."""
        for shape, left in self.left.items():
            if left > 0 and not self.may_be_cancelled(shape):
                self.block(shape)
