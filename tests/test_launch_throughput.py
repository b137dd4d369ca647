"""Many short jobs, fast: the work a start costs the daemon does not grow with the queue
behind it, and reading finished jobs back (a `wait` on a sweep's ids) stays cheap.

In this process (tests/inproc.py): the real loop, handlers, job control and SQLite store,
fake shims. Work is counted (jobs built, rows decoded), never timed.
"""

from __future__ import annotations

import pytest

from gpusched.core.models import Job
from gpusched.store import rows

WAITING = 300


@pytest.fixture
def job_inits(monkeypatch) -> list[int]:
    """How many Job objects __init__ builds (dataclasses.replace goes through it)."""
    built = [0]
    init = Job.__init__

    def counting(self, *args, **kwargs):
        built[0] += 1
        init(self, *args, **kwargs)

    monkeypatch.setattr(Job, "__init__", counting)
    return built


def test_a_start_behind_a_full_box_does_not_rebuild_every_waiting_job(make_box, job_inits):
    """Behind full GPUs the reason of every job in line names the next one in line, so it
    changes for all of them at each start: 1,000 `--gpus 1` jobs on 4 GPUs made the daemon
    rebuild 500,000 jobs through dataclasses.replace (7 ms of its CPU per job)."""
    box = make_box("4x80GiB")
    ids = box.submit_all("--gpus", "1", "--from-file", "-", stdin="true\n" * (WAITING + 4))
    box.step()
    first, second = ids[4], ids[5]
    assert box.show(ids[-1])["pending_reason"].startswith(f"behind job {first}, which is next")

    job_inits[0] = 0
    box.exit(ids[0])  # one end, one start: every waiting job's reason changes
    assert job_inits[0] < 50, f"{job_inits[0]} jobs built for one start"

    assert box.running() == {*ids[1:4], first}
    assert (
        box.show(second)["pending_reason"]
        == "needs 1 whole GPU; every allowed GPU is held whole by a running job"
    )
    for job_id in (ids[6], ids[-1]):
        assert box.show(job_id)["pending_reason"] == (
            f"behind job {second}, which is next in line; needs 1 whole GPU; every allowed "
            "GPU is held whole by a running job"
        )


# -- a finished job read back: the faster row checks still catch a damaged row -------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("env", {"PATH": 5}),  # a dict[str, str] with a number in it
        ("env", {7: "x"}),
        ("command", ("sh", None)),  # a tuple[str, ...] with a hole
        ("started_at", "yesterday"),  # float | None
        ("exit_code", True),  # int | None: a bool is not a count
        ("array_id", 1.5),
    ],
)
def test_a_damaged_value_is_still_caught_by_the_row_checks(field, value):
    job = Job(id=7, command=("true",), cwd="/", uid=0, user="root")
    rows.check_job(job)  # the undamaged job passes
    object.__setattr__(job, field, value)
    with pytest.raises(rows.DamagedRow, match=f"{field} holds"):
        rows.check_job(job)


def test_whole_numbers_and_none_pass_where_a_job_holds_times():
    job = Job(
        id=7,
        command=("true",),
        cwd="/",
        uid=0,
        user="root",
        started_at=5,
        ended_at=None,
        exit_code=0,
        env={"A": "b"},
    )
    rows.check_job(job)


# -- wait on a sweep's ids after it ended -------------------------------------------------------


def test_a_wait_on_many_ended_jobs_reads_them_in_one_go(make_box, monkeypatch):
    """`gpusched wait` on a sweep that has ended read each job from the queue file on its
    own (1,000 queries and decodes for 1,000 ids) before it looked at one."""
    from gpusched.store.database import Store

    box = make_box("4x80GiB", "[host]\ncpus = 64\n[jobs]\nmax_running = 100\n")
    ids = box.submit_all("--gpus", "0", "--from-file", "-", stdin="true\n" * 60)
    box.step()
    for job_id in ids:
        box.exit(job_id)
    singles = [0]
    get = Store.get

    def counting(self, job_id):
        singles[0] += 1
        return get(self, job_id)

    monkeypatch.setattr(Store, "get", counting)
    result = box.call("wait", ids=ids)
    assert result["done"] and [job["id"] for job in result["jobs"]] == ids
    assert {job["state"] for job in result["jobs"]} == {"succeeded"}
    assert singles[0] < 5, f"{singles[0]} jobs read one at a time"
    with pytest.raises(Exception, match="no job 9999"):  # an unknown id still says so
        box.call("wait", ids=[*ids, 9999])
