"""`gpusched resubmit ID`: a job run again as a new job, from the spec the daemon keeps."""

from __future__ import annotations

import json

from test_cli_errors import assert_one_error_line

SPEC_FIELDS = (
    "command",
    "cwd",
    "gpus_requested",
    "gpu_mem_bytes",
    "cpus",
    "cpus_required",
    "mem_bytes",
    "priority",
    "time_limit_s",
    "warn_signal",
    "warn_before_s",
    "retries",
    "retry_delay_s",
    "constraints",
    "dependencies",
    "policy",
    "user",
    "uid",
)


def test_resubmit_runs_the_job_again_with_its_spec_and_environment(home, tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    first = home.submit(
        "--gpus",
        "1",
        "--gpu-mem",
        "10G",
        "--time",
        "1h",
        "--signal",
        "USR1@60",
        "--cpus",
        "2",
        "--mem",
        "1G",
        "--priority",
        "3",
        "--gpu-type",
        "Simulated",
        "--retries",
        "1",
        "--retry-delay",
        "3s",
        "--name",
        "probe",
        "--env",
        "SECRET=kept",
        "--cwd",
        str(workdir),
        "--",
        "sh",
        "-c",
        'echo "$SECRET $(pwd) $GPUSCHED_JOB_ID"',
    )
    old = home.wait_state(first, "succeeded", "failed")
    assert old["state"] == "succeeded"

    # Elsewhere, in another environment: the job keeps its own.
    proc = home.run("resubmit", str(first), cwd=tmp_path, env={"SECRET": "changed"})
    again = int(proc.stdout)
    assert again > first
    new = home.wait_state(again, "succeeded", "failed")
    assert new["state"] == "succeeded" and new["name"] == "probe"
    assert {k: new[k] for k in SPEC_FIELDS} == {k: old[k] for k in SPEC_FIELDS}
    assert new["attempt"] == 1 and new["submitted_at"] > old["submitted_at"]
    assert home.run("logs", str(again)).stdout == f"kept {workdir} {again}\n"
    assert home.json("env", str(again)) == home.json("env", str(first))
    assert home.show(first)["state"] == "succeeded"  # the old job is left as it was


def test_resubmit_changes_what_it_is_told_and_can_hold(home):
    first = home.submit("--gpus", "1", "--gpu-mem", "10G", "--name", "a", "--", "true")
    home.wait_state(first, "succeeded")
    again = home.json(
        "resubmit",
        str(first),
        "--gpus",
        "2",
        "--gpu-mem",
        "5G",
        "--name",
        "b",
        "--priority",
        "7",
        "--time",
        "30m",
        "--cpus",
        "3",
        "--mem",
        "2G",
        "--hold",
    )["id"]
    job = home.show(again)
    assert job["state"] == "pending" and job["held"]
    assert (
        job["gpus_requested"],
        job["gpu_mem_bytes"],
        job["name"],
        job["priority"],
        job["time_limit_s"],
        job["cpus"],
        job["mem_bytes"],
    ) == (2, 5 * 2**30, "b", 7, 1800.0, 3, 2 * 2**30)
    home.run("release", str(again))
    assert home.wait_state(again, "succeeded", "failed")["state"] == "succeeded"

    # Cores it did not ask for stay so: it still never waits for one.
    assert home.show(int(home.run("resubmit", str(first)).stdout))["cpus_required"] is False
    # --gpus 0 takes what only a GPU job may ask for with the GPUs.
    cpu_only = home.show(int(home.run("resubmit", str(first), "--gpus", "0").stdout))
    assert (cpu_only["gpus_requested"], cpu_only["gpu_mem_bytes"]) == (0, None)


def test_resubmit_wait_exits_with_the_new_jobs_status(home):
    first = home.submit("--", "sh", "-c", "exit 3")
    home.wait_state(first, "failed")
    proc = home.run("resubmit", "--wait", str(first), check=False)
    assert proc.returncode == 3
    assert home.show(int(proc.stdout))["exit_code"] == 3


def test_resubmit_of_a_running_job_leaves_it_running(home, tmp_path):
    gate = tmp_path / "go"
    running = home.submit(
        "--gpus", "1", "--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"
    )
    home.wait_state(running, "running")
    again = int(home.run("resubmit", str(running)).stdout)
    home.wait_state(again, "running")
    assert home.show(running)["state"] == "running"
    gate.touch()
    for job in (running, again):
        assert home.wait_state(job, "succeeded", "failed")["state"] == "succeeded"


def test_resubmit_of_an_array_or_one_element(home):
    array = home.json(
        "submit", "--array", "0-3%2", "--", "sh", "-c", 'exit "$GPUSCHED_ARRAY_INDEX"'
    )["ids"]
    for job in array:
        home.wait_state(job, "succeeded", "failed")
    whole = home.json("resubmit", str(array[0]))["ids"]
    assert len(whole) == 4
    jobs = [home.show(i) for i in whole]
    assert [j["array_index"] for j in jobs] == [0, 1, 2, 3]
    assert {j["array_id"] for j in jobs} == {whole[0]} and jobs[0]["array_throttle"] == 2

    one = home.json("resubmit", f"{array[0]}_2")["id"]
    element = home.wait_state(one, "succeeded", "failed")
    assert (element["array_id"], element["array_index"], element["exit_code"]) == (one, 2, 2)


def test_resubmit_errors_are_one_line(home):
    job = home.submit("--", "true")
    home.wait_state(job, "succeeded")
    before = json.loads(home.run("ls", "--all", "--json").stdout)
    assert_one_error_line(home.run("resubmit", "999999", check=False), 1, "no job 999999")
    assert_one_error_line(home.run("resubmit", "abc", check=False), 2, "'abc'")
    assert_one_error_line(
        home.run("resubmit", str(job), "--gpu-mem", "1G", check=False), 2, "--gpu-mem", "--gpus 1"
    )
    assert_one_error_line(
        home.run("resubmit", str(job), "--time", "soon", check=False), 2, "--time", "soon"
    )
    assert_one_error_line(home.run("resubmit", check=False), 2, "JOBID")
    assert json.loads(home.run("ls", "--all", "--json").stdout) == before  # nothing queued


def test_a_jobs_spec_checks_back_into_the_same_fields():
    from dataclasses import replace

    from gpusched.core.models import Constraints, Job, Request
    from gpusched.core.spec.jobspec import check_job_spec, job_spec

    request = Request(2, 5 * 2**30, Constraints((0, 2), (3,), "H100", 2**30, (8, 0)), 4, 2**30)
    job = Job(
        id=7,
        command=("python", "train.py"),
        cwd="/w",
        uid=1,
        user="u",
        request=request,
        name="n",
        priority=-3,
        held=True,
        dependencies=(("afterok", 3), ("afterany", 4)),
        kill_on_invalid_dep=True,
        time_limit_s=60.0,
        warn_signal=10,
        warn_before_s=5.0,
        retries=2,
        retry_on=("failed", "timeout"),
        policy="spread",
        pty=True,
    )
    fields = check_job_spec(job_spec(job), ["pack", "spread"])
    assert replace(job, held=False) == replace(Job(id=7, cwd="/w", uid=1, user="u", **fields))


def test_the_client_sends_only_changes_the_daemon_takes():
    from gpusched.client.submit.options import RESUBMIT_FIELDS
    from gpusched.core.spec.jobspec import RESUBMIT_CHANGES

    assert sorted(RESUBMIT_FIELDS.values()) == sorted(RESUBMIT_CHANGES)
