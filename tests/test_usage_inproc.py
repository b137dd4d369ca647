"""`gpusched usage`'s sums (the daemon in this process, tests/inproc.py, on a clock the test
moves): GPU time cut to the period, waits, ends by state, and jobs retention removed."""

from __future__ import annotations

import pytest

from gpusched.core.errors import UsageError
from gpusched.daemon.loop import Call
from gpusched.daemon.observe import usage
from gpusched.daemon.requests.request import Request
from inproc import ME


def by_key(report: dict) -> dict[str, dict]:
    return {line["key"]: line for line in report["groups"]}


def test_gpu_time_waits_and_ends_per_user(make_box):
    box = make_box("2x80GiB")
    two = box.submit("--gpus", "2", "--", "train")
    box.exit(two, 0, seconds=3600)  # two GPUs for an hour
    one = box.submit("--gpus", "1", "--name", "eval", "--", "eval")  # starts at once
    box.exit(one, 1, seconds=1800)
    report = box.call("usage")
    (me,) = report["groups"]
    assert me["jobs"] == 2 and me["states"] == {"failed": 1, "succeeded": 1}
    assert me["gpu_seconds"] == pytest.approx(2 * 3600 + 1800)
    assert me["mean_wait_s"] == pytest.approx(0.0)
    assert report["total"]["gpu_seconds"] == me["gpu_seconds"]
    assert set(by_key(box.call("usage", by="name"))) == {"train", "eval"}  # as ls names them


def test_a_period_cuts_runs_that_began_before_it_and_counts_running_jobs(make_box):
    box = make_box("2x80GiB")
    old = box.submit("--gpus", "1", "--", "old")
    box.exit(old, 0, seconds=7200)  # ended 2 h after it started...
    running = box.submit("--gpus", "1", "--", "long")
    box.step(3600)  # ...and this one has run an hour so far
    report = box.call("usage", since_s=5400)  # the last 90 minutes
    (me,) = report["groups"]
    # The old job's last 30 minutes (it ended an hour ago), and the running one's hour.
    assert me["gpu_seconds"] == pytest.approx(1800 + 3600)
    assert me["states"] == {"running": 1, "succeeded": 1}
    assert running in box.running()


def test_a_wait_is_counted_when_the_job_starts(make_box):
    box = make_box("1x80GiB")
    first = box.submit("--gpus", "1", "--", "a")
    second = box.submit("--gpus", "1", "--", "b")
    box.exit(first, 0, seconds=100)  # the second waited 100 s for the GPU
    box.step()
    box.exit(second, 0, seconds=10)
    assert box.call("usage")["groups"][0]["mean_wait_s"] == pytest.approx(50)


def test_removed_jobs_count_in_all_time_by_user_only(make_box):
    box = make_box("1x80GiB", config='[jobs]\nkeep_finished = "1h"\nkeep_finished_count = 0\n')
    job = box.submit("--gpus", "1", "--", "a")
    box.exit(job, 0, seconds=600)
    box.step(7200)
    box.call("gc")  # (if the daemon's own sweep has not removed it already)
    assert box.call("list", all=True)["jobs"] == []  # gone from the queue, into the summary
    report = box.call("usage")
    assert report["removed_jobs"] == {"jobs": 1, "included": True}
    (me,) = report["groups"]
    assert me["jobs"] == 1 and me["gpu_seconds"] == pytest.approx(600)
    assert me["states"] == {"succeeded": 1} and me["mean_wait_s"] == pytest.approx(0)
    since = box.call("usage", since_s=86400)
    assert since["groups"] == [] and since["removed_jobs"] == {"jobs": 1, "included": False}


def test_a_wrong_grouping_lists_the_valid_ones(make_box):
    box = make_box()
    with pytest.raises(UsageError, match="use one of: user, name"):
        box.call("usage", by="group")


def test_a_large_report_reads_a_window_a_turn_and_others_are_answered_meanwhile(
    make_box, monkeypatch
):
    """A report over a long history must not hold the loop: it reads the store a window
    of ids per turn (a whole store of 100,000 at once held the loop for a second)."""
    monkeypatch.setattr(usage, "WINDOW_IDS", 10)
    monkeypatch.setattr(usage, "TURN_BUDGET_S", 0.0)  # one window a turn, however fast
    box = make_box()
    for _ in range(35):
        job = box.submit("--", "true")
        box.exit(job, 0, seconds=60)
    report = Call(Request("usage", {}, ME))
    box.daemon.step([report])
    assert not report.done.is_set()  # 35 ids: four windows, one a turn
    status = Call(Request("status", {}, ME))
    box.daemon.step([status])
    assert status.done.is_set() and status.error is None
    while not report.done.is_set():
        box.daemon.step([])
    assert report.error is None
    (me,) = report.result["groups"]
    assert me["jobs"] == 35 and me["gpu_seconds"] == 0.0 and me["states"] == {"succeeded": 35}
