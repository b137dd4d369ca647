"""The daemon's decisions when a job's shim dies while the job's processes run on (in process).

The real loop and job control on fake shims (tests/inproc.py): the fake finds a job's
processes by its run token, as the real seam does without the shim. The same behaviour
with real processes is in tests/test_shim_death.py.
"""

from __future__ import annotations

import signal

GRACE = '[daemon]\ncancel_grace = "10s"\n'


def poll(box, seconds: float = 0.0) -> None:
    """A turn of the loop once the next GPU poll (and liveness check) is due."""
    box.step(seconds + box.daemon.settings.gpu_poll_interval_s)


def started_with_leftovers(box, *pids_ignoring_term: tuple[int, bool]) -> int:
    """A one-GPU job that is running, its processes left behind by a shim that died."""
    job_id = box.submit("--gpus", "1", "--", "train")
    box.step()
    for pid, ignores in pids_ignoring_term:
        box.shims.leave_running(job_id, pid, ignores_term=ignores)
    box.shims.vanish(job_id)
    return job_id


def test_the_gpus_stay_reserved_until_the_processes_left_are_gone(make_box):
    box = make_box("1x80GiB", GRACE)
    job_id = started_with_leftovers(box, (101, False), (102, True))
    gpus = box.show(job_id)["gpus"]
    poll(box)
    job = box.show(job_id)
    assert job["state"] == "running" and job["gpus"] == gpus
    assert job["end_reason"] == (
        "its shim died; stopping its processes (pids 101, 102); "
        "its GPUs stay reserved until they are gone"
    )
    box.step()  # 101 ended on SIGTERM
    assert box.show(job_id)["end_reason"].startswith(
        "its shim died; stopping its processes (pid 102);"
    )
    assert sorted(box.shims.process_signals) == [(101, signal.SIGTERM), (102, signal.SIGTERM)]
    assert box.shims.notes and "sent SIGTERM" in box.shims.notes[0][1]

    waiting = box.submit("--gpus", "1", "--", "true")
    box.step(9)  # within the grace: the one that ignores SIGTERM runs on
    assert box.states(job_id, waiting) == ["running", "pending"]
    box.step(1)  # the grace is over: SIGKILL
    assert (102, signal.SIGKILL) in box.shims.process_signals
    box.step()
    job = box.show(job_id)
    assert job["state"] == "lost"
    assert "vanished" in job["end_reason"]
    assert (
        "stopped the processes it left (pids 101, 102; SIGTERM, then SIGKILL" in job["end_reason"]
    )
    assert box.show(waiting)["state"] == "running"
    assert box.show(waiting)["gpus"] == gpus


def test_processes_that_end_on_sigterm_free_the_gpus_at_once(make_box):
    box = make_box("1x80GiB", GRACE)
    job_id = started_with_leftovers(box, (101, False))
    waiting = box.submit("--gpus", "1", "--", "true")
    poll(box)
    box.step()
    job = box.show(job_id)
    assert job["state"] == "lost" and "(pid 101; SIGTERM) before freeing" in job["end_reason"]
    assert box.show(waiting)["state"] == "running"


def test_a_daemon_restart_keeps_the_job_and_its_gpus_until_its_processes_end(make_box):
    box = make_box("1x80GiB", GRACE)
    job_id = started_with_leftovers(box, (101, True))
    poll(box)
    assert box.show(job_id)["state"] == "running"

    box.restart(crash=True)
    waiting = box.submit("--gpus", "1", "--", "true")
    job = box.show(job_id)
    assert job["state"] == "running" and job["end_reason"].startswith("its shim died")
    assert box.show(waiting)["state"] == "pending"
    assert box.shims.process_signals[-1] == (101, signal.SIGTERM)  # sent again

    box.stop(crash=True)
    box.shims.end_process(101)  # it ended while no daemon ran
    box.start()
    job = box.show(job_id)
    assert (job["state"], job["end_reason"]) == (
        "lost",
        "the job's shim vanished without an exit record (killed, or the machine "
        "rebooted); the processes it left have ended",
    )
    assert box.show(waiting)["state"] == "running"


def test_a_job_whose_shim_died_with_nothing_left_is_lost_at_once(make_box):
    box = make_box("1x80GiB", GRACE)
    job_id = started_with_leftovers(box)
    poll(box)
    job = box.show(job_id)
    assert (job["state"], job["end_reason"]) == (
        "lost",
        "the job's shim vanished without an exit record (killed, or the machine rebooted)",
    )
    assert box.shims.process_signals == []


def test_after_a_reboot_nothing_is_looked_for(make_box):
    """The boot id changed: no process of the job can run, whatever has its token now."""
    box = make_box("1x80GiB", GRACE)
    job_id = started_with_leftovers(box, (101, True))
    box.stop(crash=True)
    box.shims.boot_id = "another-boot"
    box.start()
    assert box.show(job_id)["state"] == "lost"
    assert box.shims.process_signals == []


def test_each_attempt_gets_its_own_token_and_retries_wait_for_the_leftovers(make_box):
    box = make_box("1x80GiB", GRACE)
    job_id = box.submit(
        "--gpus", "1", "--retries", "1", "--retry-on", "lost", "--retry-delay", "1s", "--", "train"
    )
    box.step()
    first = box.shims.launched[job_id]["env"].get("GPUSCHED_RUN_TOKEN", "")
    first_start = box.show(job_id)["started_at"]
    box.shims.leave_running(job_id, 101, ignores_term=True)
    box.shims.vanish(job_id)
    poll(box)
    assert box.show(job_id)["state"] == "running"  # not re-queued while 101 runs
    box.shims.end_process(101)
    box.step()
    assert box.show(job_id)["state"] == "pending"
    box.step(2)
    box.step()
    assert box.show(job_id)["state"] == "running"
    second = box.shims.launched[job_id]["env"]["GPUSCHED_RUN_TOKEN"]
    # The token names the attempt: this one's id, attempt and start time.
    assert first == f"{job_id}.1.{first_start!r}"
    assert second == f"{job_id}.2.{box.show(job_id)['started_at']!r}" != first
