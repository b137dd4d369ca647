"""Retention's decisions in the in-process daemon: which finished jobs go and when, what
stays, the usage summary, fair share untouched, and removals a batch per turn."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpusched.core.errors import GpuschedError
from gpusched.daemon.jobs import retention
from gpusched.daemon.loop import Call
from gpusched.daemon.requests.request import Request
from gpusched.proc import runfile
from inproc import ME

HOUR_S = 3600.0


def ran(box, *argv: str, seconds: float = 60.0, code: int = 0) -> int:
    """A job submitted, started and ended `seconds` later."""
    job_id = box.submit(*argv, "--", "true")
    box.step()
    assert job_id in box.running()
    box.exit(job_id, code, seconds=seconds)
    return job_id


def listed(box) -> list[int]:
    return [job["id"] for job in box.call("list", all=True)["jobs"]]


def sweep_due(box, seconds: float = 0.0) -> None:
    """Time passes (seconds), past the next sweep; turns of the loop until it is done."""
    box.step(seconds + retention.SWEEP_INTERVAL_S)
    while box.daemon.retention.busy:
        box.step()


def test_finished_jobs_older_than_keep_finished_go_with_their_files_and_newer_stay(make_box):
    box = make_box(config='[jobs]\nkeep_finished = "1h"\nkeep_finished_count = 0\n')
    old = [ran(box, "--gpus", "1") for _ in range(3)]
    run_files = [runfile.run_file(box.paths.jobs_dir, i) for i in old]
    logs = [box.show(i)["stdout_path"] for i in old]
    for path in logs:
        Path(path).write_text("old output\n")  # the fake shims write no logs
    assert all(os.path.exists(p) for p in run_files)
    box.step(2 * HOUR_S)
    new = ran(box)
    sweep_due(box)
    assert listed(box) == [new]
    assert not any(os.path.exists(p) for p in run_files + logs)
    with pytest.raises(GpuschedError, match="no job"):
        box.show(old[0])


def test_a_pty_jobs_socket_left_by_a_killed_shim_goes_with_the_job(make_box):
    box = make_box(config='[jobs]\nkeep_finished = "1h"\nkeep_finished_count = 0\n')
    job_id = ran(box, "--pty")
    sock = Path(runfile.pty_socket_path(box.show(job_id)["stdout_path"], job_id))
    sock.write_text("")  # the fake shims serve no terminal; a killed shim's stays behind
    box.step(2 * HOUR_S)
    sweep_due(box)
    assert not sock.exists()


def test_the_usage_of_removed_jobs_is_kept_by_user_and_state(make_box):
    box = make_box(config='[jobs]\nkeep_finished = "1h"\n')
    ran(box, "--gpus", "2", "--cpus", "4", seconds=100)
    ran(box, "--gpus", "1", seconds=50, code=3)
    sweep_due(box, 2 * HOUR_S)
    removed = box.call("status")["removed_jobs"]
    user = box.show(ran(box))["user"]
    assert removed["jobs"] == 2
    assert removed["by_user"][user]["succeeded"] == {
        "jobs": 1,
        "run_s": 100.0,
        "gpu_s": 200.0,
        "core_s": 400.0,
        "mem_byte_s": 0.0,
        "waited": 1,
        "wait_s": 0.0,
    }
    assert removed["by_user"][user]["failed"]["gpu_s"] == 50.0
    box.restart()  # stored, not only in memory
    assert box.call("status")["removed_jobs"] == removed


def test_fair_share_does_not_change_when_old_jobs_are_removed(make_box):
    box = make_box(config='[jobs]\nkeep_finished = "2m"\n')
    ran(box, "--gpus", "2", seconds=100)
    box.step(300)  # past keep_finished, not yet the daemon's next sweep
    assert not box.daemon.retention.busy
    before = box.call("status")["fairshare_usage"]
    assert before
    report = box.call("gc")  # no time passes: the usage must be exactly the same
    assert report["jobs"] == 1 and listed(box) == []
    assert box.call("status")["fairshare_usage"] == before
    box.restart()
    assert box.call("status")["fairshare_usage"] == before


def test_the_count_limit_keeps_the_newest_finished_jobs(make_box):
    box = make_box(config='[jobs]\nkeep_finished = ""\nkeep_finished_count = 2\n')
    ids = [ran(box) for _ in range(5)]
    pending = box.submit("--hold", "--", "true")  # not finished: never counted
    dry = box.call("gc", dry_run=True)
    assert (dry["dry_run"], dry["jobs"]) == (True, 3)
    assert listed(box) == ids + [pending]  # a dry run removes nothing
    assert box.call("gc")["jobs"] == 3
    assert listed(box) == ids[3:] + [pending]


def test_a_finished_job_an_active_job_depends_on_stays_however_old(make_box):
    box = make_box(config='[jobs]\nkeep_finished = "1h"\n')
    needed = ran(box)
    dependent = box.submit("--hold", "--dependency", f"afterok:{needed}", "--", "true")
    sweep_due(box, 2 * HOUR_S)
    assert needed in listed(box)
    assert box.call("gc", dry_run=True)["kept_for_dependents"] == 1
    box.call("cancel", ids=[dependent])
    sweep_due(box, 2 * HOUR_S)
    assert listed(box) == []  # both, now that nothing waits on the first


def test_an_array_with_active_elements_keeps_its_finished_ones(make_box):
    box = make_box(config='[jobs]\nkeep_finished = "1h"\n')
    first, second = box.submit_all("--array", "0-1", "--gpus", "1", "--", "true")
    box.step()
    box.exit(first, 0)
    sweep_due(box, 2 * HOUR_S)
    assert listed(box) == [first, second]
    box.exit(second, 0)
    sweep_due(box, 2 * HOUR_S)
    assert listed(box) == []


def test_a_large_removal_goes_a_batch_per_turn_and_others_are_answered_meanwhile(make_box):
    box = make_box(config='[jobs]\nkeep_finished = "1h"\n')
    count = retention.REMOVALS_PER_TURN * 3 + 10
    ids = box.submit_all("--hold", "--array", f"0-{count - 1}", "--", "true")
    box.call("cancel", ids=[ids[0]])  # the array: all its elements end, cancelled
    box.clock.now += 2 * HOUR_S  # old now; the monotonic clock stays: no sweep of its own
    gc = Call(Request("gc", {}, ME))
    box.daemon.step([gc])
    assert not gc.done.is_set()  # more than one turn's work
    status = Call(Request("status", {}, ME))
    box.daemon.step([status])
    assert status.done.is_set() and status.error is None
    turns = 2
    while not gc.done.is_set():
        box.daemon.step([])
        turns += 1
    assert gc.error is None and gc.result["jobs"] == count
    assert turns >= 3
    assert listed(box) == []


def test_a_home_with_flat_files_of_an_older_version_keeps_its_running_job(make_box):
    """A job started by a version that kept files flat in the jobs directory runs on
    across the upgrade: the new daemon finds its run file there and records its end."""
    box = make_box()
    job_id = box.submit("--", "true")
    box.step()
    spec = box.shims.launched[job_id]
    flat = os.path.join(box.paths.jobs_dir, f"{job_id}.run.jsonl")
    os.replace(spec["run_file"], flat)  # where the older version's shim wrote it
    spec["run_file"] = flat
    box.restart(crash=True)
    box.step()
    assert box.show(job_id)["state"] == "running"  # re-adopted, not lost
    assert box.exit(job_id, 4)["exit_code"] == 4


def test_a_pass_that_could_remove_nothing_is_skipped_until_a_job_is_old(make_box, monkeypatch):
    box = make_box(config='[jobs]\nkeep_finished = "1h"\n')
    kept = ran(box)
    sweep_due(box)  # a whole pass: the oldest job it kept ended just now
    steps = []
    step = retention.Sweep.step
    monkeypatch.setattr(retention.Sweep, "step", lambda self: steps.append(1) or step(self))
    box.step(retention.SWEEP_INTERVAL_S)
    assert steps == []  # nothing could be old yet: the ids are not even read
    sweep_due(box, HOUR_S)
    assert steps and kept not in listed(box)
