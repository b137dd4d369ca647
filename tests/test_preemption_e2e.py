"""Preemption end to end: the real CLI, a real daemon on simulated GPUs, real jobs that
checkpoint on their signal and resume."""

from __future__ import annotations

from conftest import wait_until

CONFIG = '[preemption]\nmin_run_before_preempt = "0s"\n'
# Counts to 30 in steps it saves; on SIGUSR1 it saves where it is and leaves; a restart
# goes on from the saved step.
COUNTER = r"""
i=$(cat step 2>/dev/null || echo 0)
echo "start at $i (restarts $GPUSCHED_RESTARTS)"
trap 'echo "checkpoint at $i"; echo $i > step; exit 0' USR1
while [ "$i" -lt 30 ]; do
  [ -e go ] || { sleep 0.05; continue; }
  i=$((i + 1)); echo $i > step; sleep 0.05
  [ "$i" -eq 10 ] && [ "$GPUSCHED_RESTARTS" = 0 ] && touch reached && rm go
done
echo "done at $i"
"""


def test_a_shell_job_checkpoints_on_usr1_and_resumes_after_the_urgent_job(make_home, tmp_path):
    home = make_home("1x80GiB")
    home.write_config(CONFIG)
    work = tmp_path / "work"
    work.mkdir()
    (work / "go").touch()
    low = home.submit(
        "--gpus",
        "1",
        "--preemptible",
        "--preempt-grace",
        "20s",
        "--cwd",
        str(work),
        "--",
        "sh",
        "-c",
        COUNTER,
    )
    wait_until(lambda: (work / "reached").exists(), "the job to count to 10")
    urgent = home.submit(
        "--gpus", "1", "--priority", "10", "--cwd", str(work), "--", "sh", "-c", "echo urgent ran"
    )
    wait_until(lambda: home.show(urgent)["state"] == "succeeded", "the urgent job to run")
    victim = home.show(low)
    assert victim["restarts"] == 1 and victim["preempted_by"] == urgent
    (work / "go").touch()
    victim = home.wait_state(low, "succeeded")
    assert victim["attempt"] == 2 and victim["exit_code"] == 0
    log = home.run("logs", str(low)).stdout.splitlines()
    assert log == [
        "start at 0 (restarts 0)",
        "checkpoint at 10",
        "start at 10 (restarts 1)",
        "done at 30",
    ]
    shown = home.run("show", str(urgent)).stdout
    assert f"preempted=job {low} at " in shown
    assert f"preempted_by=job {urgent} at " in home.run("show", str(low)).stdout


def test_preempt_command_ls_shows_preempting_until_sigterm_after_the_grace(make_home):
    home = make_home("1x80GiB")
    # Ignores the checkpoint signal: only SIGTERM, after the grace, stops it.
    job_id = home.submit(
        "--gpus",
        "1",
        "--preempt-grace",
        "8s",
        "--",
        "sh",
        "-c",
        'trap "" USR1; trap "echo term; exit 0" TERM; '
        'echo "restarts $GPUSCHED_RESTARTS"; '
        '[ "$GPUSCHED_RESTARTS" = 1 ] && exit 0; while :; do sleep 0.1; done',
    )
    wait_until(lambda: "restarts 0" in home.run("logs", str(job_id)).stdout, "the job to start")
    out = home.run("preempt", str(job_id)).stdout
    assert out.startswith(f"job {job_id}: preempting: SIGUSR1 now, SIGTERM in 8s")
    row = next(j for j in home.json("ls") if j["id"] == job_id)
    assert row["state"] == "running" and row["preempting"] is True
    assert "preempting" in home.run("ls").stdout
    job = home.wait_state(job_id, "succeeded")
    assert job["restarts"] == 1 and job["preempted_by"] is None
    assert home.run("logs", str(job_id)).stdout.splitlines() == ["restarts 0", "term", "restarts 1"]
