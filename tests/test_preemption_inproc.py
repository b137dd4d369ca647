"""Preemption as the daemon decides it (daemon/jobs/preempt.py): the real loop, handlers and
store, fake shims and a clock the test moves (tests/inproc.py)."""

from __future__ import annotations

import signal

NO_MIN_RUN = '[preemption]\nmin_run_before_preempt = "0s"\n'
USR1, TERM = signal.SIGUSR1, signal.SIGTERM


def running(box, *argv: str) -> int:
    job_id = box.submit(*argv)
    box.step()
    box.step()  # its shim has forked: its pid is known
    assert box.show(job_id)["state"] == "running", box.show(job_id)
    return job_id


def test_an_urgent_job_preempts_a_preemptible_one_and_takes_its_gpu(make_box):
    box = make_box("1x80GiB", NO_MIN_RUN)
    low = running(
        box, "--gpus", "1", "--preemptible", "--preempt-grace", "30s", "--", "python", "train.py"
    )
    urgent = box.submit("--gpus", "1", "--priority", "10", "--", "python", "eval.py")
    box.step()
    assert box.shims.signalled(low) == [USR1]
    assert box.show(low)["preempting"] is True
    assert box.show(urgent)["pending_reason"] == f"preempting job {low}; their GPUs are kept for it"
    box.step(31)
    assert box.shims.signalled(low) == [USR1, TERM]
    box.exit(low, None, TERM)
    box.step()
    victim, winner = box.show(low), box.show(urgent)
    assert winner["state"] == "running"
    assert victim["state"] == "pending" and victim["attempt"] == 2 and victim["restarts"] == 1
    assert victim["preempted_by"] == urgent and victim["preemptions"] == 1
    assert victim["requeue_reason"].startswith(f"preempted by job {urgent} (")
    assert winner["preempted_jobs"] == [low] and winner["preempted_jobs_at"] is not None
    # Once the urgent job ends, the victim runs again, with GPUSCHED_RESTARTS=1.
    box.exit(urgent, 0)
    box.step()
    assert box.show(low)["state"] == "running"
    assert box.shims.launched[low]["env"]["GPUSCHED_RESTARTS"] == "1"


def test_a_job_not_preemptible_is_never_touched(make_box):
    box = make_box("1x80GiB", NO_MIN_RUN)
    low = running(box, "--gpus", "1", "--", "python", "train.py")
    urgent = box.submit("--gpus", "1", "--priority", "10", "--", "python", "eval.py")
    box.step(120)
    assert box.shims.signalled(low) == []
    assert box.show(urgent)["state"] == "pending"


def test_the_config_makes_jobs_preemptible_unless_they_say_no(make_box):
    box = make_box("2x80GiB", NO_MIN_RUN + "default_preemptible = true\n")
    default = running(box, "--gpus", "1", "--", "python", "a.py")
    refused = running(box, "--gpus", "1", "--no-preemptible", "--", "python", "b.py")
    assert box.show(default)["preemptible"] and not box.show(refused)["preemptible"]
    box.submit("--gpus", "2", "--priority", "5", "--", "python", "big.py")
    box.step()
    assert box.shims.signalled(default) == [] and box.shims.signalled(refused) == []


def test_a_job_is_not_preempted_in_its_first_minutes(make_box):
    box = make_box("1x80GiB", '[preemption]\nmin_run_before_preempt = "5m"\n')
    low = running(box, "--gpus", "1", "--preemptible", "--", "python", "train.py")
    box.submit("--gpus", "1", "--priority", "10", "--", "python", "eval.py")
    box.step(60)
    assert box.shims.signalled(low) == []
    box.step(241)
    box.step()
    assert box.shims.signalled(low) == [USR1]


def test_a_job_is_preempted_at_most_max_preemptions_times(make_box):
    box = make_box("1x80GiB", NO_MIN_RUN + "max_preemptions = 1\n")
    low = running(box, "--gpus", "1", "--preemptible", "--", "python", "train.py")
    first = box.submit("--gpus", "1", "--priority", "10", "--", "python", "a.py")
    box.step()
    box.exit(low, None, TERM)
    box.step()
    assert box.show(first)["state"] == "running"
    box.exit(first, 0)
    box.step()
    assert box.show(low)["state"] == "running"
    box.submit("--gpus", "1", "--priority", "10", "--", "python", "b.py")
    box.step(600)
    assert box.shims.signalled(low) == [USR1]  # the first preemption's only


def test_the_fewest_and_cheapest_victims_are_chosen(make_box):
    box = make_box("4x80GiB", NO_MIN_RUN)
    jobs = {
        prio: running(
            box,
            "--gpus",
            "1",
            "--preemptible",
            "--priority",
            str(prio),
            "--",
            "python",
            f"p{prio}.py",
        )
        for prio in (3, 1, 2, 4)
    }
    urgent = box.submit("--gpus", "2", "--priority", "9", "--", "python", "eval.py")
    box.step()
    signalled = {prio for prio, job_id in jobs.items() if box.shims.signalled(job_id)}
    assert signalled == {1, 2}
    assert sorted(box.show(urgent)["preempted_jobs"]) == sorted([jobs[1], jobs[2]])


def test_freed_gpus_are_kept_for_the_urgent_job(make_box):
    box = make_box("2x80GiB", NO_MIN_RUN)
    a = running(box, "--gpus", "1", "--preemptible", "--", "python", "a.py")
    b = running(box, "--gpus", "1", "--preemptible", "--", "python", "b.py")
    urgent = box.submit("--gpus", "2", "--priority", "10", "--", "python", "big.py")
    box.step()
    small = box.submit("--gpus", "1", "--priority", "5", "--", "python", "small.py")
    box.exit(a, None, USR1)  # a checkpointed and left; b takes its grace
    box.step()
    box.step()
    assert box.show(small)["state"] == "pending"  # a's GPU waits for the urgent job
    assert box.show(a)["state"] == "pending"
    box.exit(b, None, TERM, seconds=61)
    box.step()
    assert box.show(urgent)["state"] == "running"
    assert sorted(box.show(urgent)["gpu_indices"]) == [0, 1]
    assert box.show(small)["state"] == "pending"


def test_a_restart_midway_neither_loses_nor_repeats_the_preemption(make_box):
    box = make_box("1x80GiB", NO_MIN_RUN)
    low = running(box, "--gpus", "1", "--preemptible", "--", "python", "train.py")
    urgent = box.submit("--gpus", "1", "--priority", "10", "--", "python", "eval.py")
    box.step(5)
    box.restart(crash=True)
    box.step(5)
    assert box.shims.signalled(low) == [USR1]
    box.step(60)
    assert box.shims.signalled(low) == [USR1, TERM]
    box.restart(crash=True)
    box.exit(low, None, TERM)
    box.step()
    assert box.show(urgent)["state"] == "running"
    victim = box.show(low)
    assert victim["state"] == "pending" and victim["restarts"] == 1 and victim["attempt"] == 2
    assert box.shims.launches.count(low) == 1 and box.shims.launches.count(urgent) == 1


def test_preemption_off_in_the_config(make_box):
    box = make_box("1x80GiB", NO_MIN_RUN + "enabled = false\n")
    low = running(box, "--gpus", "1", "--preemptible", "--", "python", "train.py")
    box.submit("--gpus", "1", "--priority", "10", "--", "python", "eval.py")
    box.step(10)
    assert box.shims.signalled(low) == []


LAS = '[scheduling]\ndiscipline = "las"\nlas_thresholds = ["1h", "8h"]\n' + NO_MIN_RUN


def test_under_las_a_new_short_job_preempts_a_long_one_and_goes_ahead_of_it(make_box):
    box = make_box("1x80GiB", LAS)
    long = running(box, "--gpus", "1", "--preemptible", "--", "python", "train.py")
    box.step(2 * 3600)  # 2 GPU-hours: past the first queue's bound (1h)
    short = box.submit("--gpus", "1", "--", "python", "eval.py")
    box.step()
    assert box.shims.signalled(long) == [USR1]
    box.exit(long, None, TERM)
    box.step()
    assert box.show(short)["state"] == "running"
    assert box.show(long)["state"] == "pending"
    # A newer job, which attained nothing, goes ahead of the long one, which keeps what
    # it attained; each waiting job's reason names its queue.
    newer = box.submit("--gpus", "1", "--", "python", "eval2.py")
    box.step()
    assert box.show(long)["pending_reason"].startswith("las queue 2 of 3; ")
    assert box.show(newer)["pending_reason"].startswith("las queue 1 of 3; ")
    box.exit(short, 0)
    box.step()
    assert box.show(newer)["state"] == "running" and box.show(long)["state"] == "pending"
    box.exit(newer, 0)
    box.step()
    assert box.show(long)["state"] == "running"  # resumed, told it is a restart
    assert box.shims.launched[long]["env"]["GPUSCHED_RESTARTS"] == "1"


def test_under_las_a_job_in_the_first_queue_is_not_preempted(make_box):
    box = make_box("1x80GiB", LAS)
    long = running(box, "--gpus", "1", "--preemptible", "--", "python", "train.py")
    box.step(1800)  # half a GPU-hour: still in the first queue, as the new job is
    box.submit("--gpus", "1", "--", "python", "eval.py")
    box.step()
    assert box.shims.signalled(long) == []


def test_under_las_a_restarted_daemon_keeps_a_preempted_jobs_queue(make_box):
    box = make_box("1x80GiB", LAS)
    long = running(box, "--gpus", "1", "--preemptible", "--", "python", "train.py")
    box.step(2 * 3600)
    short = box.submit("--gpus", "1", "--", "python", "eval.py")
    box.step()
    box.exit(long, None, TERM)
    box.step()
    assert box.show(short)["state"] == "running" and box.show(long)["state"] == "pending"
    box.restart()
    # The 2 GPU-hours the long job attained before its preemption still count: a newer
    # job goes ahead of it, and its reason names the second queue.
    newer = box.submit("--gpus", "1", "--", "python", "eval2.py")
    box.step()
    assert box.show(long)["pending_reason"].startswith("las queue 2 of 3; ")
    box.exit(short, 0)
    box.step()
    assert box.show(newer)["state"] == "running" and box.show(long)["state"] == "pending"


def test_under_las_a_big_job_that_waited_preempts_smaller_jobs_of_its_queue(make_box):
    box = make_box("2x80GiB", LAS.replace('["1h", "8h"]', '["1d"]'))  # all in queue 1
    small = [
        running(box, "--gpus", "1", "--preemptible", "--", "python", f"s{n}.py") for n in (1, 2)
    ]
    big = box.submit("--gpus", "2", "--", "python", "big.py")
    box.step(3 * 3600)
    assert [box.shims.signalled(job) for job in small] == [[], []]
    box.step(3600)  # las_preempt_smaller_after: 4 h
    box.step()
    assert [box.shims.signalled(job) for job in small] == [[USR1], [USR1]]
    for job in small:
        box.exit(job, None, TERM)
    box.step()
    assert box.show(big)["state"] == "running"
