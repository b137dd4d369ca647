"""Submits and changes too large for one turn of the loop, done a batch per turn.

A 100,000-job submit or cancel must not stop the daemon from answering anyone else: the
loop gives such a request about TURN_BUDGET_S per turn and answers other requests (and
runs its pass) between batches. The reply comes once everything has committed.

A batched submit reserves its ids first and marks them incomplete in the store (a meta
row, in the same commit as the reservation); its rows are never loaded, shown or run
until the last batch has committed and one more commit removes the mark. A daemon that
dies in between removes the rows at start-up (purge_incomplete): the submit was never
acknowledged, and its ids are not reused. A batched change is idempotent, each batch
committed as it goes.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from gpusched.core.errors import GpuschedError
from gpusched.core.models import Job
from gpusched.daemon.requests.quotas import Reservation
from gpusched.daemon.state import DaemonState
from gpusched.store.database import Store

if TYPE_CHECKING:
    from gpusched.daemon.requests.calls import Call

log = logging.getLogger("gpusched.daemon.requests.batches")

BIG_JOBS = 2000  # a submit or change of more jobs than this goes in batches
# Loop time a batched request's work takes per turn; its commit and the loop's pass come
# on top, within the loop's goal of 100 ms a turn.
TURN_BUDGET_S = 0.03
# A batched request's work and its commit together, per turn: the commit's fsync grows with
# the rows written, and on a busy disk it can take longer than the work (Pace).
TURN_GOAL_S = 0.06
MIN_WORK_S = 0.002  # at least a chunk or so a turn, however slow the disk
_CHUNK = 50  # jobs between two looks at the clock (a few ms, even on a loaded machine)
# Jobs of a committed submit made known to the scheduler per turn: the first part, then as
# many as the last part's time per job says fit in TURN_BUDGET_S, at most KNOWN_PER_TURN
# (a fixed 5,000 took from 60 to over 120 ms a turn, as the machine was loaded).
KNOWN_FIRST = 1000
KNOWN_PER_TURN = 5000
KNOWN_MIN = 50
_INCOMPLETE = "incomplete_submit:"
_T = TypeVar("_T")
CANCELLED = "the submit was cancelled before it was stored; nothing of it was queued"
_NOT_QUEUED = (
    "nothing of this submit was queued"  # meta key prefix: first id -> last id of a submit
)


def purge_incomplete(store: Store) -> None:
    """At start-up: remove the rows of submits that never completed (never acknowledged)."""
    marks = store.meta_starting(_INCOMPLETE)
    if not marks:
        return
    with store.write():
        for key, last in marks.items():
            first = int(key[len(_INCOMPLETE) :])
            store.delete_jobs(first, int(last))
            store.delete_meta(key)
            log.warning("removed jobs %d-%s of a submit that never completed", first, last)


def store_alike(store: Store, made: list[tuple[Job, Job]]) -> list[Job]:
    """Insert (template, job) pairs, one executemany per run of one template; the jobs."""
    jobs = []
    for _, run in itertools.groupby(made, key=lambda pair: id(pair[0])):
        pairs = list(run)
        alike = [job for _, job in pairs]
        store.insert_alike(pairs[0][0], alike)
        jobs += alike
    return jobs


class Batched:
    """A request done over several turns: step() does one turn's part and returns the
    result once the whole request is done (else None); abandon() when the daemon stops.
    Once `committed`, it can no longer be undone: finish() does the rest at once."""

    committed = False

    def step(self) -> Any:
        raise NotImplementedError

    def abandon(self) -> None:
        pass

    def finish(self) -> Any:
        while (result := self.step()) is None:
            pass
        return result


def step_oldest(calls: list[tuple[Call, Batched]]) -> None:
    """One turn of the first of the loop's batched calls (a Call and its Batched work): it
    is answered, and leaves the list, once done or failed (a failed batch fails only it)."""
    call, batched = calls[0]
    if call.cancelled and not batched.committed:  # nothing stays queued
        batched.abandon()
        calls.pop(0)
        call.fail(GpuschedError(CANCELLED))
        return
    try:
        result = batched.step()
    except Exception as exc:
        if not isinstance(exc, GpuschedError):
            log.exception("request %r failed in a batch", call.request.name)
            exc = GpuschedError("the daemon failed on this request; see its log")
        batched.abandon()
        calls.pop(0)
        call.fail(exc)
        return
    if result is not None:
        calls.pop(0)
        call.answer(result)


def _for_a_turn(
    items: Iterator[_T], work: Callable[[list[_T]], None], budget_s: float = TURN_BUDGET_S
) -> bool:
    """work() on chunks of items for about budget_s; whether items are left."""
    deadline = _monotonic() + budget_s
    while True:
        chunk = list(itertools.islice(items, _CHUNK))
        if chunk:
            work(chunk)
        if len(chunk) < _CHUNK:
            return False
        if _monotonic() >= deadline:
            return True


def _monotonic() -> float:
    # The machine's own clock: a turn's length is real time (tests replace this).
    return time.monotonic()


class Pace:
    """How long a batched request may work in its next turn: TURN_BUDGET_S, less once a
    commit made the turn longer than TURN_GOAL_S (its fsync grows with the rows: a batch
    size by time spent, the commit's included, not a fixed count)."""

    def __init__(self) -> None:
        self.work_s = TURN_BUDGET_S

    def batch(self, items: Iterator[_T], work: Callable[[list[_T]], None], write: Any) -> bool:
        """work() on items for this turn, inside write() (the commit); whether items are left."""
        started = _monotonic()
        with write:
            more = _for_a_turn(items, work, self.work_s)
        turn_s = _monotonic() - started
        if turn_s > 0:  # the work's share of the goal, in the proportion this turn showed
            self.work_s = min(TURN_BUDGET_S, max(MIN_WORK_S, self.work_s * TURN_GOAL_S / turn_s))
        return more


def next_part(done: int, took_s: float, most: int) -> int:
    """How many jobs the next part may take, given the last one's: TURN_BUDGET_S worth at
    the last part's pace, growing at most fourfold a turn (one quick part proves little)."""
    if took_s <= 0:
        return min(most, done * 4)
    return max(KNOWN_MIN, min(most, done * 4, int(done * TURN_BUDGET_S / took_s)))


class BatchedSubmit(Batched):
    """Jobs stored a batch per turn; once all have committed, made known to the scheduler
    a part per turn, sized by time (next_part; until then `show` and a change do not find
    them, as before the commit), and acknowledged. make_jobs(ids) yields the jobs with those ids, in
    order, each with the template it was made from (Store.insert_alike)."""

    def __init__(
        self,
        state: DaemonState,
        count: int,
        make_jobs: Callable[[list[int]], Iterator[tuple[Job, Job]]],
        result_of: Callable[[list[int]], dict[str, Any]],
        held: Reservation | None = None,
    ):
        self.state, self.count = state, count
        # Its jobs counted against its user's quota until the table holds them.
        self._held = held
        if held is not None:
            state.jobs.reserved.append(held)
        self._make_jobs, self._result_of = make_jobs, result_of
        self._ids: range | None = None
        self._left: Iterator[tuple[Job, Job]] = iter(())
        self._stored: list[tuple[int, Job]] = []  # (id, Kinds.lean of the job)
        self._pace = Pace()
        self._known = 0  # of the stored jobs, once committed
        self._known_part = KNOWN_FIRST  # how many the next turn makes known

    def step(self) -> dict[str, Any] | None:
        ids = self._ids
        if ids is None:
            self._reserve()
            return None
        if not self.committed:
            more = self._pace.batch(self._left, self._insert, self.state.write(undone=_NOT_QUEUED))
            if more:
                return None
            with self.state.write(undone=_NOT_QUEUED):  # the one commit that makes it real
                self.state.store.delete_meta(self._mark_for(ids[0]))
            self.committed = True
            return None  # made known from the next turn on: this one had two commits
        return self._make_known(ids)

    def _make_known(self, ids: range) -> dict[str, Any] | None:
        """The next jobs known to the scheduler and to requests: with 100,000 at once, the
        queue's bookkeeping alone took several hundred ms of one turn."""
        started = _monotonic()
        part = self._stored[self._known : self._known + self._known_part]
        self.state.note_known(self._unknown_ids(ids))
        self._known += len(part)
        if self._known < len(self._stored):
            self.state.note_incoming(self._unknown_ids(ids))
        self.state.remember_alike(part)
        if self._held is not None:
            self._held.shrink_to(self.count - self._known)
        if self._known < len(self._stored):
            self._known_part = next_part(len(part), _monotonic() - started, KNOWN_PER_TURN)
            return None
        self._stored = []
        self._release()
        return self._result_of(list(ids))

    def _release(self) -> None:
        if self._held is not None and self._held in self.state.jobs.reserved:
            self.state.jobs.reserved.remove(self._held)

    def _unknown_ids(self, ids: range) -> range:
        return ids[self._known :]

    def _reserve(self) -> None:
        store = self.state.store
        with self.state.write(undone=_NOT_QUEUED):
            ids = store.next_ids(self.count)
            store.reserve_ids(ids[-1])
            store.set_meta(self._mark_for(ids[0]), str(ids[-1]))
        self._ids = range(ids[0], ids[-1] + 1)
        self.state.note_incoming(self._ids)
        self._left = self._make_jobs(ids)

    @staticmethod
    def _mark_for(first_id: int) -> str:
        return f"{_INCOMPLETE}{first_id}"

    def _insert(self, made: list[tuple[Job, Job]]) -> None:
        lean = self.state.kinds.lean
        self._stored += [(job.id, lean(job)) for job in store_alike(self.state.store, made)]

    def abandon(self) -> None:
        """Remove what was stored (else the next start-up does): it was never acknowledged."""
        self._release()
        ids = self._ids
        if ids is None or self.committed:
            return
        store = self.state.store
        try:
            with store.write():
                store.delete_jobs(ids[0], ids[-1])
                store.delete_meta(self._mark_for(ids[0]))
        except Exception:
            log.exception("could not remove the incomplete submit of jobs %d-%d", ids[0], ids[-1])
            return
        self.state.note_known(ids)


class BatchedChange(Batched):
    """A change (cancel, hold, release, update) applied a batch of jobs per turn.
    apply(job) returns (outcome, refused): what happened, or why it could not."""

    def __init__(
        self, state: DaemonState, jobs: list[Job], apply: Callable[[Job], tuple[str, bool]]
    ):
        self.state, self._apply = state, apply
        self._left = iter(jobs)
        self.results: dict[str, str] = {}
        self.refused: dict[str, str] = {}
        self._pace = Pace()

    def step(self) -> dict[str, Any] | None:
        more = self._pace.batch(self._left, self._apply_each, self.state.write())
        return None if more else {"results": self.results, "refused": self.refused}

    def run_all(self) -> dict[str, Any]:
        """The whole change in one commit: for a few jobs."""
        with self.state.write():
            self._apply_each(list(self._left))
        return {"results": self.results, "refused": self.refused}

    def _apply_each(self, jobs: list[Job]) -> None:
        for job in jobs:
            # The job as it is now: an earlier batch, or the loop, may have changed it.
            outcome, refused = self._apply(self.state.jobs.get(job.id, job))
            (self.refused if refused else self.results)[str(job.id)] = outcome
