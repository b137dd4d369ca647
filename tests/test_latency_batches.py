"""A big submit's batches are sized by the time a turn took, its commit included (issue 23):
on a disk whose commits are slow, the batches shrink until a turn fits the loop's goal
again, and grow back once commits are quick. The loop's real turns, in process, on a
clock the test moves for the work and for the commits' fsyncs."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from gpusched.client.submit.fastsubmit import parse
from gpusched.client.submit.submitting import build_request
from gpusched.daemon.loop import Call
from gpusched.daemon.requests import batches
from gpusched.daemon.requests.request import Request
from inproc import ME

ELEMENTS = 20_000  # over batches.BIG_JOBS
ROW_WORK_S = 0.00002  # the time to make and insert one row (50 rows a millisecond)


class Disk:
    """The fake clock of the batches, moved by the rows inserted and by each commit."""

    def __init__(self, commit_s_per_row: float):
        self.now, self.commit_s_per_row = 0.0, commit_s_per_row
        self.rows_this_turn = self.rows_committed = 0

    def monotonic(self) -> float:
        return self.now

    def inserted(self, rows: int) -> None:
        self.rows_this_turn += rows
        self.now += rows * ROW_WORK_S

    def committed(self) -> None:
        self.now += self.rows_this_turn * self.commit_s_per_row
        self.rows_committed += self.rows_this_turn
        self.rows_this_turn = 0


@pytest.fixture
def disk(box, monkeypatch) -> Disk:
    disk = Disk(commit_s_per_row=0.0001)  # 5 ms of fsync per 1 ms of work: a busy disk
    monkeypatch.setattr(batches, "_monotonic", disk.monotonic, raising=False)
    store = box.daemon.state.store
    real_insert, real_write = store.insert_alike, store.write

    def insert_alike(template, jobs):
        disk.inserted(len(jobs))
        real_insert(template, jobs)

    @contextmanager
    def write():
        with real_write():
            yield
        disk.committed()

    monkeypatch.setattr(store, "insert_alike", insert_alike)
    monkeypatch.setattr(store, "write", write)
    return disk


def turns_of_a_big_submit(box, disk: Disk) -> list[tuple[int, float]]:
    """(rows, seconds on the fake clock) of each turn that stored rows."""
    opts = parse(["--hold", "--array", f"0-{ELEMENTS - 1}", "--", "true"])
    opts.cwd = str(box.root)
    call = Call(Request("submit", build_request(opts), ME))
    calls, turns = [call], []
    while not call.done.is_set():
        disk.rows_committed, started = 0, disk.now
        box.daemon.step(calls)
        calls = []
        if disk.rows_committed:
            turns.append((disk.rows_committed, disk.now - started))
    assert call.error is None, call.error
    assert len(call.result["ids"]) == ELEMENTS
    return turns


def test_slow_commits_make_the_next_batches_smaller_until_a_turn_fits(box, disk):
    turns = turns_of_a_big_submit(box, disk)
    first_rows, first_s = turns[0]
    assert first_s > batches.TURN_GOAL_S  # a whole budget of work, and its slow commit
    later = turns[2:-1]  # the last one is what was left
    assert later and all(rows < first_rows for rows, _ in later), turns
    assert all(seconds <= batches.TURN_GOAL_S * 1.25 for _, seconds in later), turns


def test_quick_commits_keep_the_whole_budget(box, disk):
    disk.commit_s_per_row = 0.0
    turns = turns_of_a_big_submit(box, disk)
    budget_rows = batches.TURN_BUDGET_S / ROW_WORK_S
    assert all(rows >= budget_rows for rows, _ in turns[:-1]), turns


def test_the_collector_waits_while_a_big_submit_is_stored(box):
    """A full collection walks every object it tracks: with 100,000 waiting jobs in it,
    one took over 100 ms of a turn, several times during a big submit."""
    import gc

    opts = parse(["--hold", "--array", f"0-{batches.BIG_JOBS * 2}", "--", "true"])
    opts.cwd = str(box.root)
    call = Call(Request("submit", build_request(opts), ME))
    between_turns, calls = [], [call]
    try:
        while not call.done.is_set():
            box.daemon.step(calls)
            calls = []
            between_turns.append(gc.isenabled())
    finally:
        gc.enable()
    assert call.error is None, call.error
    assert between_turns[:-1] and not any(between_turns[:-1])
    assert between_turns[-1]  # again, once the submit is done


def test_a_committed_submit_is_made_known_a_part_per_turn_then_acknowledged(box, monkeypatch):
    """With 100,000 jobs made known to the scheduler in the turn of the last commit, that
    turn took several hundred ms; no turn makes more than KNOWN_PER_TURN known."""
    monkeypatch.setattr(batches, "TURN_BUDGET_S", 10.0)  # all stored in one turn
    known = getattr(batches, "KNOWN_PER_TURN", 1000)
    count = known * 3 + 7
    state = box.daemon.state
    sizes: list[int] = []
    real = state.remember_alike

    def remember_alike(entries):
        sizes.append(len(entries))
        real(entries)

    monkeypatch.setattr(state, "remember_alike", remember_alike)
    opts = parse(["--hold", "--array", f"0-{count - 1}", "--", "true"])
    opts.cwd = str(box.root)
    call = Call(Request("submit", build_request(opts), ME))
    box.daemon.step([call])  # the ids reserved
    box.daemon.step([])  # all stored and committed; the first part known
    assert not call.done.is_set()
    assert call.batched.committed
    first = call.batched._ids[0]
    # Until acknowledged, the jobs not yet known are not found, nor can they be changed.
    with pytest.raises(Exception, match=f"no job {first + count - 1}"):
        box.call("show", ids=[first + count - 1])
    call.cancelled = True  # its client went away: too late, the submit is stored
    turns = 2
    while not call.done.is_set():
        box.daemon.step([])
        turns += 1
    assert call.error is None, call.error
    assert max(sizes) <= known and sum(sizes) == count, sizes
    assert turns >= 4
    assert len(call.result["ids"]) == count
    assert box.show(first + count - 1)["state"] == "pending"


def test_a_daemon_stopping_after_a_submit_committed_answers_it_as_queued(box, monkeypatch):
    """Stored for good: the reply must not tell its client to submit it again."""
    monkeypatch.setattr(batches, "TURN_BUDGET_S", 10.0)
    count = getattr(batches, "KNOWN_PER_TURN", 1000) * 2 + 1
    opts = parse(["--hold", "--array", f"0-{count - 1}", "--", "true"])
    opts.cwd = str(box.root)
    call = Call(Request("submit", build_request(opts), ME))
    box.daemon.step([call])
    box.daemon.step([])
    assert not call.done.is_set()
    box.daemon.answer_everyone()  # as the daemon does when it stops
    assert call.error is None, call.error
    assert len(call.result["ids"]) == count
    box.restart()
    assert len(box.daemon.state.pending()) == count
