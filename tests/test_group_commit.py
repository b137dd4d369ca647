"""Submits that arrive in the same turn of the loop share one commit (one fsync), each
answered only after it, each refused alone, and all refused when that commit fails."""

from __future__ import annotations

from pathlib import Path

from gpusched.client.submit import fastsubmit
from gpusched.client.submit.jobrequest import build_request
from gpusched.core.errors import GpuschedError
from gpusched.core.models import Job
from gpusched.daemon.loop import Call, together
from gpusched.daemon.requests.request import Request
from inproc import DISK_FULL, ME, Box, failing


def submit_call(box: Box, command: list[str], cwd: str | None = None) -> Call:
    args = {"jobs": [{"command": command}], "cwd": cwd or str(box.root)}
    return Call(Request("submit", args, ME))


def inserting_commits(box: Box, calls: list[Call]) -> int:
    """One turn of the loop with these calls: how many committed transactions inserted
    jobs (the pass after the requests commits too, but only updates)."""
    conn = failing(box)  # fails nothing unless told to: here it lets the test see statements
    transactions: list[list[str]] = []
    real = conn.execute

    def execute(sql: str, *args):
        if sql == "BEGIN IMMEDIATE":
            transactions.append([])
        elif transactions and "COMMIT" not in transactions[-1]:
            transactions[-1].append(sql.split()[0].upper())
        return real(sql, *args)

    def executemany(sql: str, rows):  # inside a write: a transaction is open
        transactions[-1].append(sql.split()[0].upper())
        return conn._conn.executemany(sql, rows)

    conn.execute, conn.executemany = execute, executemany  # type: ignore[method-assign]
    try:
        box.daemon.step(calls)
    finally:
        del conn.execute, conn.executemany
    return sum(1 for t in transactions if "INSERT" in t[: t.index("COMMIT")])


def test_submits_in_one_turn_share_one_commit_and_each_gets_its_own_ids(box: Box):
    calls = [submit_call(box, ["echo", str(n)]) for n in range(5)]
    assert inserting_commits(box, calls) == 1
    ids = [call.result["ids"] for call in calls]
    assert all(call.done.is_set() and call.error is None for call in calls)
    assert sorted(i for (i,) in ids) == [i for (i,) in ids]  # in arrival order
    for (job_id,), n in zip(ids, range(5)):
        stored = box.daemon.state.store.get(job_id)
        assert stored is not None and stored.command == ("echo", str(n))


def test_a_refused_submit_among_others_is_refused_alone(box: Box):
    good = submit_call(box, ["true"])
    bad = submit_call(box, ["true"], cwd="relative/dir")
    last = submit_call(box, ["false"])
    box.daemon.step([good, bad, last])
    assert bad.error is not None and "absolute path" in bad.error.message
    assert good.error is None and last.error is None
    queued = {job.command for job in box.daemon.state.jobs.values()}
    assert queued == {("true",), ("false",)}


def test_when_the_shared_commit_fails_no_submit_is_queued_and_each_is_told(box: Box):
    failing(box).failure = DISK_FULL
    calls = [submit_call(box, ["true"]) for _ in range(3)]
    box.daemon.step(calls)
    for call in calls:
        assert call.error is not None
        assert call.error.message.startswith("the queue cannot be written: the disk is full")
        assert call.error.message.endswith("; nothing was queued.")
    assert box.daemon.state.jobs == {}
    failing(box).failure = None
    box.step(10.0)  # the retry of failed writes is due
    again = [submit_call(box, ["true"]) for _ in range(2)]
    box.daemon.step(again)
    assert [call.error for call in again] == [None, None]
    assert len(box.daemon.state.jobs) == 2


def test_a_big_submit_in_a_group_whose_commit_fails_holds_no_quota(box: Box):
    # A submit of more than batches.BIG_JOBS is stored over later turns; while it is, it
    # holds its jobs against the user's quota. Refused with its group, it holds nothing.
    opts = fastsubmit.parse(["--hold", "--array", "0-2500", "--", "true"])
    assert opts is not None
    opts.cwd = str(box.root)
    big = Call(Request("submit", build_request(opts), ME))
    failing(box).failure = DISK_FULL
    box.daemon.step([submit_call(box, ["true"]), big])
    assert big.error is not None and big.error.message.endswith("; nothing was queued.")
    assert box.daemon.state.jobs.reserved == []
    failing(box).failure = None


def test_a_part_that_fails_leaves_nothing_in_the_store_or_in_memory(box: Box):
    state = box.daemon.state
    with state.write():
        with state.part():
            (kept,) = state.store.insert(
                [Job(id=0, command=("true",), cwd="/", uid=0, user="root")]
            )
            state.remember(state.store.get(kept))
        try:
            with state.part():
                (lost,) = state.store.insert(
                    [Job(id=0, command=("false",), cwd="/", uid=0, user="root")]
                )
                state.remember(state.store.get(lost))
                raise GpuschedError("refused after writing")
        except GpuschedError:
            pass
    assert state.store.get(kept) is not None and kept in state.jobs
    assert state.store.get(lost) is None and lost not in state.jobs


def test_only_consecutive_submits_are_grouped():
    def call(name: str) -> Call:
        return Call(Request(name, {}, ME))

    calls = [call("submit"), call("submit"), call("cancel"), call("submit"), call("ls")]
    assert [[c.request.name for c in group] for group in together(calls)] == [
        ["submit", "submit"],
        ["cancel"],
        ["submit"],
        ["ls"],
    ]


def test_the_group_s_jobs_are_stored_for_good_after_a_crash(box: Box, tmp_path: Path):
    calls = [submit_call(box, ["echo", str(n)]) for n in range(3)]
    box.daemon.step(calls)
    ids = [call.result["ids"][0] for call in calls]
    box.restart(crash=True)
    assert sorted(box.daemon.state.jobs) == sorted(ids)
