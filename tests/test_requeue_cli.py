"""`gpusched requeue` and `gpusched preempt` end to end: the real CLI, a real daemon, real jobs."""

from __future__ import annotations

from conftest import wait_until

# Says which run it is, then runs until SIGTERM, unless it is a restart.
RUN_TWICE = (
    'echo "attempt $GPUSCHED_ATTEMPT restarts $GPUSCHED_RESTARTS"; '
    '[ "$GPUSCHED_RESTARTS" = 1 ] && exit 0; '
    'trap "echo stopped; exit 0" TERM; while :; do sleep 0.1; done'
)


def log_of(home, job_id: int) -> str:
    return home.run("logs", str(job_id)).stdout


def test_requeue_a_running_job_same_id_restart_count_and_log_appended(home):
    job_id = home.submit("--", "sh", "-c", RUN_TWICE)
    wait_until(lambda: "restarts 0" in log_of(home, job_id), "the first run to start")
    proc = home.run("requeue", str(job_id))
    assert f"job {job_id}: stopping" in proc.stdout
    job = home.wait_state(job_id, "succeeded")
    assert job["attempt"] == 2 and job["restarts"] == 1
    assert log_of(home, job_id).splitlines() == [
        "attempt 1 restarts 0",
        "stopped",
        "attempt 2 restarts 1",
    ]
    shown = home.run("show", str(job_id)).stdout
    assert "requeued by" in shown


def test_requeue_an_ended_job_runs_it_again(home):
    job_id = home.submit("--", "sh", "-c", 'echo "restarts $GPUSCHED_RESTARTS"')
    home.wait_state(job_id, "succeeded")
    assert home.run("requeue", str(job_id)).stdout.strip() == f"job {job_id}: requeued"
    wait_until(
        lambda: log_of(home, job_id).splitlines() == ["restarts 0", "restarts 1"],
        "the second run's line appended to the log",
    )
    assert home.wait_state(job_id, "succeeded")["restarts"] == 1


def test_requeue_of_a_pending_job_exits_1_and_says_why(home):
    job_id = home.submit("--hold", "--", "true")
    proc = home.run("requeue", str(job_id), check=False)
    assert proc.returncode == 1
    assert proc.stderr == (
        f"Error: job {job_id}: pending; only running and ended jobs can be requeued\n"
    )
    assert home.show(job_id)["state"] == "pending"


def test_preempt_of_a_finished_job_exits_1(home):
    job_id = home.submit("--", "true")
    home.wait_state(job_id, "succeeded")
    proc = home.run("preempt", str(job_id), check=False)
    assert proc.returncode == 1
    assert proc.stderr == (f"Error: job {job_id}: succeeded; only running jobs can be preempted\n")
