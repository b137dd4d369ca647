"""`submit -o/--output`, `-e/--error` and `--open-mode`, end to end: a real daemon in a
temporary home, the real CLI, jobs submitted the way Slurm users submit them (a script
with #SBATCH lines, relative paths from a working directory)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from conftest import REPO, executable, wait_until
from slurmhome import cluster_home


def work_dir(home, *subdirs: str) -> Path:
    work = home.path / "work"
    for sub in ("", *subdirs):
        (work / sub).mkdir(parents=True, exist_ok=True)
    return work


def test_a_scripts_sbatch_output_goes_to_its_file_relative_to_the_working_directory(home):
    work = work_dir(home, "logs")
    executable(
        work / "train.sh",
        "#!/bin/sh\n#SBATCH -J train\n#SBATCH -o logs/%x-%j.out\necho out; echo err >&2\n",
    )
    job_id = int(home.run("submit", "--", "./train.sh", cwd=work).stdout)
    job = home.wait_state(job_id, "succeeded", "failed")
    chosen = work / "logs" / f"train-{job_id}.out"
    assert job["state"] == "succeeded", job["end_reason"]
    # Without --error, errors go with the output, as in Slurm.
    assert chosen.read_text() == "out\nerr\n"
    assert (job["stdout_path"], job["stderr_path"]) == (str(chosen), str(chosen))
    assert job["open_mode"] == "truncate"
    assert home.run("logs", str(job_id)).stdout == "out\nerr\n"
    assert home.run("logs", "--stderr", str(job_id)).stdout == "out\nerr\n"
    assert str(chosen) in home.run("show", str(job_id)).stdout
    assert not list(home.state.joinpath("jobs").rglob(f"{job_id}.*.log"))  # no own logs


def test_output_and_error_apart_with_the_array_patterns(home):
    work = work_dir(home, "out")
    array_id = int(
        home.run(
            "submit",
            "-o",
            "out/%A_%a.out",
            "--error=out/%A_%3a.err",
            "--array",
            "0-1",
            "--",
            "sh",
            "-c",
            "echo o$GPUSCHED_ARRAY_INDEX; echo e$GPUSCHED_ARRAY_INDEX >&2",
            cwd=work,
        ).stdout
    )
    jobs = [j for j in home.jobs() if j["array_id"] == array_id]
    assert len(jobs) == 2
    for job in jobs:
        home.wait_state(job["id"], "succeeded")
        index = job["array_index"]
        assert (work / "out" / f"{array_id}_{index}.out").read_text() == f"o{index}\n"
        assert (work / "out" / f"{array_id}_{index:03d}.err").read_text() == f"e{index}\n"
    logs = home.run("logs", "--stderr", f"{array_id}_1").stdout
    assert logs == "e1\n"


def test_only_error_leaves_the_output_in_gpuscheds_own_log(home):
    work = work_dir(home)
    job_id = home.submit("-e", "errors.txt", "--", "sh", "-c", "echo out; echo err >&2")
    job = home.wait_state(job_id, "succeeded")
    assert Path(job["stderr_path"]) == home.path / "errors.txt"
    assert home.run("logs", str(job_id)).stdout == "out\n"
    assert (home.path / "errors.txt").read_text() == "err\n"
    assert work.exists()


def test_open_mode_truncate_is_the_default_and_append_keeps_the_file(home):
    work = work_dir(home)
    for name in ("fresh.out", "kept.out"):
        (work / name).write_text("before\n")
    fresh = int(home.run("submit", "-o", "fresh.out", "--", "echo", "new", cwd=work).stdout)
    kept = int(
        home.run(
            "submit", "-o", "kept.out", "--open-mode=append", "--", "echo", "new", cwd=work
        ).stdout
    )
    for job_id in (fresh, kept):
        home.wait_state(job_id, "succeeded")
    assert (work / "fresh.out").read_text() == "new\n"
    assert (work / "kept.out").read_text() == "before\nnew\n"
    assert home.show(kept)["open_mode"] == "append"


def test_a_retried_job_truncates_at_its_first_run_only(home):
    work = work_dir(home)
    (work / "r.out").write_text("an older job's\n")
    job_id = int(
        home.run(
            "submit",
            "-o",
            "r.out",
            "--retries",
            "1",
            "--retry-delay",
            "0",
            "--",
            "sh",
            "-c",
            "echo run $GPUSCHED_ATTEMPT; exit 1",
            cwd=work,
        ).stdout
    )
    job = home.wait_state(job_id, "failed")
    assert job["attempt"] == 2
    assert (work / "r.out").read_text() == "run 1\nrun 2\n"


def test_a_missing_directory_is_refused_at_submit(home):
    work = work_dir(home)
    proc = home.run("submit", "-o", "nowhere/%j.out", "--", "true", cwd=work, check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == (
        f"Error: --output nowhere/%j.out: the directory {work}/nowhere does "
        "not exist. Create it first (Slurm would fail the job), or give "
        "another path\n"
    )
    proc = home.run("submit", "-e", "/nonexistent-dir/x.err", "--", "true", check=False)
    assert proc.returncode == 1 and "/nonexistent-dir does not exist" in proc.stderr
    assert home.jobs() == []


def test_an_output_name_that_is_not_utf8_is_refused_and_the_queue_kept(home):
    """The store keeps the pattern as text, as it keeps the working directory: a name in
    another encoding is refused in one line, not stored half way."""
    work = work_dir(home)
    kept = int(home.run("submit", "--hold", "--", "true", cwd=work).stdout)
    name = os.fsdecode(b"out-\xff-%j.txt")  # what a Latin-1 shell hands the CLI
    proc = home.run("submit", "-o", name, "--", "true", cwd=work, check=False)
    assert proc.returncode == 2 and proc.stdout == ""  # refused as a bad command line
    assert proc.stderr.startswith("Error: --output must be a UTF-8 file name")
    assert len(proc.stderr.splitlines()) == 1
    assert [job["id"] for job in home.jobs()] == [kept]


def test_a_directory_gone_before_the_start_fails_the_job_with_the_reason(home):
    work = work_dir(home, "gone")
    job_id = int(home.run("submit", "--hold", "-o", "gone/x.out", "--", "true", cwd=work).stdout)
    (work / "gone").rmdir()
    home.run("release", str(job_id))
    job = home.wait_state(job_id, "failed")
    assert job["end_reason"].startswith("cannot start: ")
    assert str(work / "gone" / "x.out") in job["end_reason"], job["end_reason"]
    assert "cannot start" in home.run("show", str(job_id)).stdout


@pytest.mark.parametrize("runner", ["supervisor", "shim"])
def test_a_fifo_as_output_fails_its_job_at_the_start_and_holds_up_nothing(make_home, runner):
    """A FIFO nobody reads would hold the job's open() for ever, before the job can take
    a signal: no cancel, no time limit, its GPU kept (and the supervisor with it). It is
    refused at the start instead, for -o and -e alike; /dev/null goes on working."""
    home = make_home()
    if runner == "shim":  # a capped log: a shim of its own opens the logs
        home.write_config('[jobs]\nmax_log_size = "1M"\n')
    work = work_dir(home)
    os.mkfifo(work / "pipe")
    ids = [
        int(
            home.run(
                "submit",
                "--gpus",
                "1",
                "--time",
                "5s",
                option,
                "pipe",
                "--",
                "sleep",
                "600",
                cwd=work,
            ).stdout
        )
        for option in ("-o", "-e")
    ]
    for job_id in ids:
        job = home.wait_state(job_id, "failed", "succeeded", "timeout", "cancelled", timeout=30)
        assert job["state"] == "failed", job
        assert job["end_reason"] == (
            f"cannot start: output {work / 'pipe'} is a FIFO (named "
            "pipe); give a regular file, a terminal or /dev/null"
        )
    quiet = home.submit(
        "--gpus", "1", "-o", "/dev/null", "--", "sh", "-c", "echo out; echo err >&2"
    )
    assert home.wait_state(quiet, "succeeded", "failed")["state"] == "succeeded"


def test_a_bad_open_mode_names_the_valid_ones(home):
    proc = home.run("submit", "-o", "x.out", "--open-mode", "sometimes", "--", "true", check=False)
    assert proc.returncode == 2
    assert proc.stderr == (
        "Error: --open-mode 'sometimes' is not a mode; valid: truncate, append\n"
    )


def test_gc_never_removes_the_users_output_files(home):
    home.write_config("[jobs]\nkeep_finished_count = 1\n")
    work = work_dir(home)
    ids = [
        int(home.run("submit", "-o", f"mine-{i}.out", "--", "echo", str(i), cwd=work).stdout)
        for i in range(2)
    ]
    for job_id in ids:
        home.wait_state(job_id, "succeeded")
    assert home.run("gc").stdout.startswith("removed 1 finished job(s)")
    assert [j["id"] for j in home.jobs()] == ids[1:]
    assert (work / "mine-0.out").read_text() == "0\n"  # the job is gone, its file stays
    assert not list(home.state.joinpath("jobs").rglob(f"{ids[0]}.*"))  # gpusched's own went


def test_the_log_cap_and_the_gpu_oom_scan_follow_the_chosen_file(home):
    home.write_config('[jobs]\nmax_log_size = "4K"\n')
    work = work_dir(home)
    job_id = int(
        home.run(
            "submit",
            "-o",
            "big.out",
            "--",
            "sh",
            "-c",
            "seq -f 'line %g' 1 20000; echo done >&2",
            cwd=work,
        ).stdout
    )
    home.wait_state(job_id, "succeeded")
    text = (work / "big.out").read_text()
    assert text.startswith("[gpusched: ") and text.endswith("done\n")
    assert len(text.encode()) <= 4096
    oom = int(
        home.run(
            "submit",
            "--gpus",
            "1",
            "-o",
            "oom.out",
            "--",
            "sh",
            "-c",
            "echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to "
            "allocate 2.00 GiB' >&2; exit 1",
            cwd=work,
        ).stdout
    )
    assert home.wait_state(oom, "gpu_oom", "failed")["state"] == "gpu_oom"


def test_submit_json_and_show_json_name_the_files(home):
    work = work_dir(home)
    job_id = json.loads(
        home.run(
            "submit", "--json", "-J", "named", "--output", "%x.%j.log", "--", "true", cwd=work
        ).stdout
    )["id"]
    job = home.wait_state(job_id, "succeeded")
    assert job["stdout_path"] == str(work / f"named.{job_id}.log")


def test_resubmit_expands_the_patterns_again_for_the_new_job(home):
    work = work_dir(home)
    first = int(home.run("submit", "-o", "r-%j.out", "--", "echo", "again", cwd=work).stdout)
    home.wait_state(first, "succeeded")
    second = int(home.run("resubmit", str(first)).stdout)
    job = home.wait_state(second, "succeeded")
    assert job["stdout_path"] == str(work / f"r-{second}.out")
    assert (
        (work / f"r-{first}.out").read_text() == (work / f"r-{second}.out").read_text() == "again\n"
    )


def test_a_cluster_job_refuses_output_files_in_one_line(slurm, make_home, tmp_path):
    home, root = cluster_home(make_home, slurm, tmp_path)
    refused = home.run(
        "submit", "--cluster", "hpc", "-o", "x.out", "--", "true", cwd=root, check=False
    )
    assert refused.returncode == 1
    assert refused.stderr == (
        "Error: cannot hand this job to cluster hpc: --output and "
        "--error are not handed to a cluster yet: its jobs' logs are on "
        "the shared directory, read with `gpusched logs ID`; leave them "
        "out\n"
    )


PROGRESS_JOB = """
import os, sys, time
sys.path.insert(0, os.environ["REPO"])
from gpusched import job
job.progress(0.42, "step 42")
while not os.path.exists("release"):
    time.sleep(0.02)
"""


def test_progress_is_reported_and_kept_out_of_the_users_directory(home):
    work = work_dir(home, "logs")
    job_id = int(
        home.run(
            "submit",
            "-o",
            "logs/p.out",
            "--env",
            f"REPO={REPO}",
            "--",
            sys.executable,
            "-c",
            PROGRESS_JOB,
            cwd=work,
        ).stdout
    )
    shown = wait_until(lambda: (j := home.show(job_id))["progress"] and j, "a progress report")
    assert shown["progress"]["message"] == "step 42"
    (work / "release").touch()
    home.wait_state(job_id, "succeeded")
    assert sorted(p.name for p in (work / "logs").iterdir()) == ["p.out"]
