"""Writes to the queue that fail, on every write path, in one process: a refused request
leaves nothing behind (in memory, in the store, on the GPUs), the loop's own writes (starts,
ends, retries) wait and happen once writes work, and ids are never given twice.

The store's connection is wrapped so that COMMIT fails on demand with SQLite's own error
(a full disk, a busy lock), as a real one does; the real disk-full and lock cases run in
tests/test_write_failures.py."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpusched.core.errors import GpuschedError
from gpusched.proc import runfile
from inproc import DISK_FULL, LOCKED, Box, failing


def updates_only(statements: list[str]) -> bool:
    """The loop's passes (and changes): they update jobs; a submit only inserts."""
    return "UPDATE" in statements


def refused(box: Box, name: str, **args) -> str:
    with pytest.raises(GpuschedError) as caught:
        box.call(name, **args)
    return caught.value.message


def stored(box: Box, job_id: int) -> dict | None:
    job = box.daemon.state.store.get(job_id)
    return (
        None
        if job is None
        else {
            "state": job.state.value,
            "held": job.held,
            "priority": job.priority,
            "attempt": job.attempt,
        }
    )


def retry(box: Box) -> None:
    """A turn of the loop once the retry of failed writes is due (10 s: the longest delay)."""
    box.step(10.0)


# -- requests -------------------------------------------------------------------------------
def test_a_submit_whose_commit_fails_is_refused_in_words_and_never_runs(box):
    failing(box).failure = DISK_FULL
    message = refused(box, "submit", jobs=[{"command": ["true"]}], cwd=str(box.root))
    assert message.startswith(
        "the queue cannot be written: the disk is full (database or "
        "disk is full). Free space on the filesystem of "
    )
    assert message.endswith("; nothing was queued.")
    assert box.daemon.state.jobs == {}
    failing(box).failure = None
    retry(box)
    box.step()
    assert box.shims.launches == [] and box.call("list", all=True)["jobs"] == []


def test_ids_a_refused_submit_had_are_not_given_again(box):
    failing(box).failure = LOCKED
    for _ in range(3):
        refused(box, "submit", jobs=[{"command": ["true"]}] * 2, cwd=str(box.root))
    failing(box).failure = None
    assert box.submit("--", "true") == 7  # 1 to 6 went to the refused submits


@pytest.mark.parametrize(
    "verb,args,before",
    [
        ("hold", {}, {"state": "pending", "held": False, "priority": 0, "attempt": 1}),
        (
            "update",
            {"priority": 5},
            {"state": "pending", "held": False, "priority": 0, "attempt": 1},
        ),
        ("cancel", {}, {"state": "pending", "held": False, "priority": 0, "attempt": 1}),
    ],
)
def test_a_refused_change_of_a_pending_job_changes_nothing(make_box, verb, args, before):
    box = make_box("1x80GiB")
    box.submit("--gpus", "1", "--", "true")  # takes the one GPU
    waiting = box.submit("--gpus", "1", "--", "true")
    failing(box).failure = DISK_FULL
    message = refused(box, verb, ids=[str(waiting)], **args)
    assert "the disk is full" in message and message.endswith("; nothing was changed.")
    assert stored(box, waiting) == before
    assert box.daemon.state.jobs[waiting].held is False
    assert box.daemon.state.jobs[waiting].priority == 0
    assert waiting in {j.id for j in box.daemon.state.pending()}


def test_a_refused_cancel_of_a_running_job_does_not_signal_it(box):
    job_id = box.submit("--", "sleep", "100")
    box.step()  # its shim forks
    failing(box).failure = LOCKED
    assert "the queue is locked by another process" in refused(box, "cancel", ids=[str(job_id)])
    assert box.shims.signalled(job_id) == []
    assert not box.daemon.state.jobs[job_id].cancel_requested
    failing(box).failure = None
    retry(box)
    box.call("cancel", ids=[str(job_id)])
    assert box.shims.signalled(job_id) == [15]


def test_a_refused_drain_leaves_the_queue_open(box):
    failing(box).failure = DISK_FULL
    refused(box, "drain")
    assert box.call("status")["draining"] is False
    assert box.daemon.state.store.get_meta("draining") != "1"


# -- the loop's own writes --------------------------------------------------------------------
def test_a_start_that_cannot_be_stored_launches_nothing_and_starts_later(box):
    conn = failing(box)
    conn.failure, conn.only = DISK_FULL, updates_only
    job_id = box.submit("--", "true")  # stored; its start is not
    assert box.shims.launches == [] and box.shims.ports == {}
    assert stored(box, job_id)["state"] == "pending"
    assert box.show(job_id)["state"] == "pending"
    box.step(0.1)  # within the backoff: the loop does not try again at once
    assert conn.failed_commits == 1
    conn.failure = None
    retry(box)
    assert box.shims.launches == [job_id]
    assert stored(box, job_id)["state"] == "running"


def test_an_end_while_writes_fail_is_recorded_once_they_work(box):
    job_id = box.submit("--", "true")
    box.step()
    conn = failing(box)
    conn.failure = LOCKED
    box.shims.exit(job_id, 3)
    box.step()
    assert stored(box, job_id)["state"] == "running"
    assert box.daemon.state.jobs[job_id].is_running  # memory as the store says
    retry(box)
    assert box.daemon.state.jobs[job_id].is_running
    conn.failure = None
    retry(box)
    job = box.show(job_id)
    assert (job["state"], job["exit_code"]) == ("failed", 3)


def test_a_start_that_fails_while_writes_fail_shows_its_end_before_it_is_stored(box):
    box.shims.refuse_launches = True  # as a shim that cannot write to a full disk
    conn = failing(box)
    commits: list[bool] = []
    conn.failure = DISK_FULL  # from the first write after the start's
    conn.only = lambda statements: (
        updates_only(statements) and (commits.append(True) or len(commits) > 1)
    )
    job_id = box.submit("--", "true")
    assert stored(box, job_id)["state"] == "running" and conn.failed_commits == 1
    job = box.show(job_id)
    assert (job["state"], job["end_reason"], job["end_unstored"]) == (
        "failed",
        "cannot start its shim: the shim launcher does not take requests",
        True,
    )
    (row,) = box.call("list")["jobs"]
    assert (row["id"], row["state"]) == (job_id, "failed")
    conn.failure = None
    retry(box)
    assert stored(box, job_id)["state"] == "failed"
    assert (box.show(job_id)["state"], box.show(job_id)["end_unstored"]) == ("failed", False)


def test_a_retry_while_writes_fail_keeps_the_exit_record_and_runs_again_once(box):
    job_id = box.submit("--retries", "1", "--retry-delay", "0", "--", "false")
    box.step()
    conn = failing(box)
    conn.failure = DISK_FULL
    box.shims.exit(job_id, 1)
    box.step()
    assert Path(runfile.run_file(box.paths.jobs_dir, job_id)).exists()  # the only record
    assert box.shims.launches == [job_id]
    conn.failure = None
    retry(box)
    box.step()
    assert box.shims.launches == [job_id, job_id]
    assert stored(box, job_id) == {"state": "running", "held": False, "priority": 0, "attempt": 2}


def test_fair_share_usage_of_a_run_ended_during_failures_counts_once(make_box):
    usage = []
    for fail in (False, True):
        box = make_box()
        job_id = box.submit("--gpus", "1", "--", "true")
        box.step(100.0)
        box.shims.exit(job_id, 0)
        if fail:
            failing(box).failure = DISK_FULL
            box.step()
            box.step(10.0)
            failing(box).failure = None
            box.step(10.0)
        else:
            box.step()
            box.step(20.0)
        usage.append(box.call("status")["fairshare_usage"])
    assert usage[0] == usage[1] and usage[0]


# -- telling people ----------------------------------------------------------------------------
def test_status_and_ls_say_why_writes_fail_and_the_log_says_it_once(box, caplog):
    caplog.set_level(logging.INFO, logger="gpusched.daemon.writes")
    conn = failing(box)
    conn.failure = DISK_FULL
    for _ in range(3):
        refused(box, "submit", jobs=[{"command": ["true"]}], cwd=str(box.root))
        retry(box)
    problem = box.call("status")["write_problem"]
    assert problem["cause"] == "the disk is full (database or disk is full)"
    assert problem["remedy"].startswith("Free space on the filesystem of ")
    assert problem["since"] == pytest.approx(box.clock.time() - 30.0)
    assert box.call("list")["write_problem"] == problem
    conn.failure = None
    retry(box)
    assert box.call("status")["write_problem"] is None
    lines = [r.getMessage() for r in caplog.records]
    assert sum("writes to the queue fail: the disk is full" in m for m in lines) == 1
    assert sum("writes to the queue work again" in m for m in lines) == 1


def test_a_stale_run_file_of_another_run_is_never_read_as_this_ones(box):
    stale = {"job_id": 1, "run": "1.1.1.0", "run_file": runfile.run_file(box.paths.jobs_dir, 1)}
    Path(stale["run_file"]).parent.mkdir(exist_ok=True)
    Path(stale["run_file"]).write_text(
        runfile.record_line("spec", stale)
        + runfile.record_line("shim", {"pid": 1, "start_ticks": 1, "run": stale["run"]})
        + runfile.record_line(
            "exit",
            {"exit_code": 7, "signal": None, "ended_at": 1.0, "error": "", "run": stale["run"]},
        )
    )
    box.shims.hold_forks = True  # the new shim has not replaced the file yet
    job_id = box.submit("--", "true")
    assert job_id == 1
    box.step()
    assert box.show(job_id)["state"] == "running"
    box.shims.fork(job_id)
    assert box.exit(job_id, 0)["state"] == "succeeded"
