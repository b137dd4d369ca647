"""A pass reads the run files of the jobs whose end was reported, not every running job's.

In process (tests/inproc.py): the real loop, job control and store; the fake shims write
run files and report ends as shims do (a wake-up from the run's end address). Run-file
reads are counted: with 4 jobs running and one ending at a time, every pass used to read
all 4. A job's pid comes with the supervisor's acknowledgement of its start, or without
one (an older supervisor) from its run file. A user-visible end to end check of the same path is bench/bench_throughput.py and
every test that waits for a job's end on a real daemon.
"""

from __future__ import annotations

import pytest

from gpusched.proc import runfile

SLOW_POLL = '[daemon]\ngpu_poll_interval = "60s"\n'  # no liveness check during a test


@pytest.fixture
def reads(monkeypatch) -> list[int]:
    """The ids of the jobs whose run file the daemon reads, in order."""
    seen: list[int] = []
    real = runfile.read_run

    def counted(jobs_root, job_id, run=None):
        seen.append(job_id)
        return real(jobs_root, job_id, run)

    monkeypatch.setattr(runfile, "read_run", counted)
    return seen


def _four_running(box, *flags: str) -> list[int]:
    ids = [box.submit("--gpus", "0", *flags, "--", "sleep", "300") for _ in range(4)]
    box.step(61.0)  # the liveness check: their pids come from their run files
    assert box.running() == set(ids)
    assert all(job.runner_pid for job in box.daemon.state.running())
    return ids


def _pids_known(box) -> set[int]:
    return {job.id for job in box.daemon.state.running() if job.runner_pid}


def test_passes_with_no_end_reported_read_no_run_file(make_box, reads):
    box = make_box(config=SLOW_POLL)
    _four_running(box)
    reads.clear()
    for _ in range(3):
        box.step()
        box.daemon.state.note_schedule_needed()  # a full pass each time
    assert reads == []


def test_a_reported_end_reads_that_jobs_run_file_only(make_box, reads):
    box = make_box(config=SLOW_POLL)
    ids = _four_running(box)
    reads.clear()
    assert box.exit(ids[1], code=3)["state"] == "failed"
    assert reads == [ids[1]]
    assert box.running() == {ids[0], ids[2], ids[3]}


def test_an_end_whose_report_is_lost_is_found_by_the_liveness_check(make_box, reads):
    """The fallback for a lost wake-up (a full wake socket): every poll interval, every
    running job's run file is read."""
    box = make_box(config=SLOW_POLL)
    ids = _four_running(box)
    box.shims.report_end = None  # the datagram never arrives
    box.shims.exit(ids[0], code=0)
    box.step()
    assert ids[0] in box.running()
    reads.clear()
    box.step(61.0)
    assert sorted(reads[:4]) == sorted(ids)
    assert box.states(ids[0]) == ["succeeded"]


def test_a_wake_up_that_names_no_run_reads_every_run_file(make_box, reads):
    box = make_box(config=SLOW_POLL)
    ids = _four_running(box)
    box.shims.report_end = None
    box.shims.exit(ids[2], code=0)
    box.daemon.wake(runfile.WAKE, None)  # a shim that could not bind its end address
    reads.clear()
    box.step()
    assert sorted(reads) == sorted(ids)
    assert box.states(ids[2]) == ["succeeded"]


def test_a_reported_end_is_read_again_after_a_failed_commit(make_box, reads):
    box = make_box(config=SLOW_POLL)
    ids = _four_running(box)
    with box.failing_writes():
        box.exit(ids[3], code=0)
        assert ids[3] in box.running()  # its end could not be stored
    reads.clear()
    box.step(1.0)  # the next retry of the loop's writes
    box.step(5.0)
    assert set(reads) == {ids[3]}
    assert box.states(ids[3]) == ["succeeded"]


def test_a_started_jobs_pid_comes_with_the_acknowledgement_and_no_run_file_is_read(make_box, reads):
    box = make_box(config=SLOW_POLL)
    ids = [box.submit("--gpus", "0", "--", "sleep", "300") for _ in range(4)]
    box.step()
    assert _pids_known(box) == set(ids)
    assert reads == []
    box.call("cancel", ids=[ids[1]])
    assert box.shims.signalled(ids[1]) == [15]
    assert reads == []


# A supervisor of a version before start acknowledgements (still running after an upgrade):
# the pid comes from the run file.


def test_a_plain_job_being_launched_is_not_read_until_its_end(make_box, reads):
    """Nothing waits for the pid of a `--gpus 0` job with no time limit: its run file is
    read once, when its end is reported (the read that finds the pid finds the end)."""
    box = make_box(config=SLOW_POLL)
    box.shims.acknowledges = False
    ids = [box.submit("--gpus", "0", "--", "sleep", "300") for _ in range(4)]
    for _ in range(3):
        box.step()
    assert box.running() == set(ids) and not _pids_known(box)
    assert reads == []
    assert box.exit(ids[0])["state"] == "succeeded"
    assert reads == [ids[0]]


def test_a_job_being_launched_is_read_when_a_cancel_waits_for_its_pid(make_box, reads):
    box = make_box(config=SLOW_POLL)
    box.shims.acknowledges = False
    ids = [box.submit("--gpus", "0", "--", "sleep", "300") for _ in range(2)]
    box.step()
    assert reads == []
    box.call("cancel", ids=[ids[1]])
    assert ids[1] in _pids_known(box) and ids[0] not in _pids_known(box)
    assert box.shims.signalled(ids[1]) == [15]
    assert set(reads) == {ids[1]}


@pytest.mark.parametrize(
    "flags", [("--gpus", "0", "--time", "10"), ("--gpus", "1")], ids=["time-limit", "gpus"]
)
def test_a_job_being_launched_is_read_until_its_pid_is_known(make_box, reads, flags):
    """A time limit's signal needs the pid; so does telling GPU processes apart."""
    box = make_box(config=SLOW_POLL)
    box.shims.acknowledges = False
    job_id = box.submit(*flags, "--", "sleep", "300")
    box.step()
    assert _pids_known(box) == {job_id}
    reads.clear()
    box.step()
    assert reads == []
