"""`requeue` and `preempt` as the daemon decides them (daemon/jobs/requeue.py): the real loop,
handlers and store, fake shims and a clock the test moves (tests/inproc.py)."""

from __future__ import annotations

import signal

import pytest


def started(box, *argv: str) -> int:
    job_id = box.submit(*argv)
    box.step()
    assert box.show(job_id)["state"] == "running"
    return job_id


def test_requeue_stops_a_running_job_and_queues_it_again_under_its_id(box):
    job_id = started(box, "--gpus", "1", "--mem", "1G", "--", "python", "train.py")
    box.shims.rss_bytes[job_id] = 700 * 2**20
    box.step(box.daemon.settings.gpu_poll_interval_s)  # the poll reads it
    assert box.show(job_id)["mem_peak_bytes"] == 700 * 2**20
    reply = box.call("requeue", ids=[job_id])
    assert reply["results"] == {str(job_id): "stopping; it goes back to the queue when it ends"}
    assert box.shims.signalled(job_id) == [signal.SIGTERM]
    assert box.show(job_id)["preempting"] is True
    box.shims.rss_bytes[job_id] = 0  # the next run has used nothing yet
    box.exit(job_id, None, signal.SIGTERM)
    job = box.show(job_id)
    # Straight back: the next pass starts it again, as attempt 2, restart 1.
    assert job["state"] == "running" and job["attempt"] == 2 and job["restarts"] == 1
    assert job["requeue_reason"].startswith("requeued by ")
    assert box.shims.launched[job_id]["env"]["GPUSCHED_RESTARTS"] == "1"
    assert box.shims.launched[job_id]["env"]["GPUSCHED_ATTEMPT"] == "2"
    assert box.shims.launches.count(job_id) == 2
    # The new run is not marked with the last one's end: no signal 15, no exit code, no
    # memory peak.
    assert (job["signal"], job["exit_code"], job["mem_peak_bytes"]) == (None, None, None)


def test_a_retried_job_keeps_its_last_end_while_pending_and_runs_without_it(box):
    job_id = started(box, "--retries", "1", "--retry-delay", "30s", "--", "python", "train.py")
    box.exit(job_id, None, signal.SIGKILL)
    pending = box.show(job_id)
    assert pending["state"] == "pending" and pending["signal"] == signal.SIGKILL
    box.step(31)
    again = box.show(job_id)
    assert again["state"] == "running" and again["attempt"] == 2
    assert (again["signal"], again["exit_code"]) == (None, None)


def test_requeue_puts_an_ended_job_back_in_the_queue(box):
    job_id = started(box, "--", "false")
    assert box.exit(job_id, 1)["state"] == "failed"
    assert box.call("requeue", ids=[job_id])["results"] == {str(job_id): "requeued"}
    box.step()
    job = box.show(job_id)
    assert job["state"] == "running" and job["attempt"] == 2 and job["restarts"] == 1
    assert job["ended_at"] is None
    assert box.exit(job_id, 0)["state"] == "succeeded"


def test_requeue_refuses_a_pending_job(box):
    job_id = box.submit("--hold", "--", "true")
    reply = box.call("requeue", ids=[job_id])
    assert reply["refused"] == {str(job_id): "pending; only running and ended jobs can be requeued"}
    assert box.show(job_id)["state"] == "pending"


def test_preempt_refuses_a_job_that_is_not_running(box):
    job_id = box.submit("--hold", "--", "true")
    assert (
        "only running jobs can be preempted"
        in box.call("preempt", ids=[job_id])["refused"][str(job_id)]
    )


def test_restarts_do_not_use_up_retries(box):
    job_id = started(box, "--retries", "1", "--retry-delay", "0", "--", "python", "train.py")
    box.call("requeue", ids=[job_id])
    box.exit(job_id, None, signal.SIGTERM)
    assert box.show(job_id)["attempt"] == 2
    # Its one retry is still there: a failure now queues attempt 3.
    box.exit(job_id, 1)
    box.step()
    assert box.show(job_id)["attempt"] == 3


def test_preempt_sends_the_checkpoint_signal_then_sigterm_after_the_grace(box):
    job_id = started(box, "--preempt-grace", "30s", "--", "python", "train.py")
    reply = box.call("preempt", ids=[job_id])
    assert reply["results"][str(job_id)].startswith("preempting: SIGUSR1 now, SIGTERM in 30s")
    assert box.shims.signalled(job_id) == [signal.SIGUSR1]
    box.step(29)
    assert box.shims.signalled(job_id) == [signal.SIGUSR1]
    box.step(2)
    assert box.shims.signalled(job_id) == [signal.SIGUSR1, signal.SIGTERM]
    box.step(5)
    assert box.shims.signalled(job_id) == [signal.SIGUSR1, signal.SIGTERM]  # once
    job = box.exit(job_id, None, signal.SIGTERM)
    assert job["state"] in ("pending", "running") and job["restarts"] == 1


def test_a_preempt_before_the_jobs_pid_is_known_keeps_its_checkpoint_signal_and_grace(box):
    """The job may already run (and write a checkpoint) while its launch is still being
    reported: once its pid is known it gets the checkpoint signal, and SIGTERM only when
    the grace that began at the preempt runs out; a restart sends neither again."""
    box.shims.hold_forks = True
    job_id = started(box, "--preempt-grace", "30s", "--", "python", "train.py")
    reply = box.call("preempt", ids=[job_id])
    assert reply["results"][str(job_id)].startswith("preempting: SIGUSR1 now, SIGTERM in 30s")
    assert box.shims.signals == []  # nothing to signal yet
    box.step(5)
    box.shims.fork(job_id)
    box.step()
    assert box.shims.signalled(job_id) == [signal.SIGUSR1]
    assert box.show(job_id)["state"] == "running"
    box.restart(crash=True)
    box.step(20)
    assert box.shims.signalled(job_id) == [signal.SIGUSR1]
    box.step(6)  # 31 s since the preempt
    assert box.shims.signalled(job_id) == [signal.SIGUSR1, signal.SIGTERM]


def test_a_requeue_before_the_jobs_pid_is_known_sends_sigterm_once_it_is(box):
    box.shims.hold_forks = True
    job_id = started(box, "--", "python", "train.py")
    box.call("requeue", ids=[job_id])
    assert box.shims.signals == []
    box.shims.fork(job_id)
    box.step()
    assert box.shims.signalled(job_id) == [signal.SIGTERM]


def test_the_jobs_own_signal_is_its_checkpoint_signal(box):
    job_id = started(box, "--time", "1h", "--signal", "USR2@60", "--", "python", "train.py")
    box.call("preempt", ids=[job_id])
    assert box.shims.signalled(job_id) == [signal.SIGUSR2]


def test_a_restart_during_the_grace_neither_loses_nor_repeats_the_requeue(box):
    job_id = started(box, "--preempt-grace", "60s", "--", "python", "train.py")
    box.call("preempt", ids=[job_id])
    box.step(10)
    box.restart(crash=True)
    box.step(10)
    assert box.shims.signalled(job_id) == [signal.SIGUSR1]  # not sent again
    job = box.show(job_id)
    assert job["state"] == "running" and job["preempting"] is True
    box.step(45)
    assert box.shims.signalled(job_id) == [signal.SIGUSR1, signal.SIGTERM]
    box.restart(crash=True)
    box.step(1)
    assert box.shims.signalled(job_id) == [signal.SIGUSR1, signal.SIGTERM]
    job = box.exit(job_id, None, signal.SIGTERM)
    assert job["restarts"] == 1 and job["attempt"] == 2
    assert box.shims.launches.count(job_id) == 2


def test_a_cancel_during_the_grace_wins(box):
    job_id = started(box, "--", "python", "train.py")
    box.call("preempt", ids=[job_id])
    box.call("cancel", ids=[job_id])
    assert box.exit(job_id, None, signal.SIGTERM)["state"] == "cancelled"


def test_a_job_that_exits_0_on_its_checkpoint_signal_is_requeued(box):
    """It saved a checkpoint and left: its work is not done."""
    job_id = started(box, "--", "python", "train.py")
    box.call("preempt", ids=[job_id])
    job = box.exit(job_id, 0)
    assert job["state"] in ("pending", "running") and job["restarts"] == 1


@pytest.mark.parametrize("command", ["requeue", "preempt"])
def test_only_the_owner_or_an_admin_may_requeue(box, command):
    job_id = started(box, "--", "python", "train.py")
    from gpusched.core.errors import GpuschedError

    with pytest.raises(GpuschedError, match="only they or an admin may"):
        box.call(command, creds=(1, 54321, 54321), ids=[job_id])
