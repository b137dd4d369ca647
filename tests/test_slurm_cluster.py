"""Cluster jobs end to end against a real one-node Slurm: submit, ls, show, wait, logs, cancel."""

from __future__ import annotations

import json
import re

from conftest import executable, wait_until
from slurmhome import cluster_home, show


def _submit(home, root, *args: str) -> int:
    out = home.run("submit", "--json", "--cluster", "hpc", *args, cwd=root)
    return json.loads(out.stdout)["id"]


def test_two_gpu_jobs_get_distinct_gpus_and_wait_returns_the_exit_status(
    slurm, make_home, tmp_path
):
    home, root = cluster_home(make_home, slurm, tmp_path)
    ids = [
        _submit(
            home,
            root,
            "--gpus",
            "1",
            "--",
            "bash",
            "-c",
            'echo "gpus=$SLURM_JOB_GPUS job=$GPUSCHED_JOB_ID"; sleep 1',
        )
        for _ in range(2)
    ]
    failing = _submit(home, root, "--", "bash", "-c", "echo to-stderr >&2; exit 3")
    waited = home.run("wait", str(failing), check=False)
    assert waited.returncode == 3, waited.stderr
    submitted = home.run(
        "submit", "--cluster", "hpc", "--wait", "--", "bash", "-c", "exit 4", cwd=root, check=False
    )
    assert submitted.returncode == 4, submitted.stderr
    for job_id in ids:
        assert home.run("wait", str(job_id), check=False).returncode == 0
    outputs = {home.run("logs", str(j)).stdout.strip() for j in ids}
    assert outputs == {f"gpus=0 job={ids[0]}", f"gpus=1 job={ids[1]}"} or outputs == {
        f"gpus=1 job={ids[0]}",
        f"gpus=0 job={ids[1]}",
    }
    assert home.run("logs", "--stderr", str(failing)).stdout.strip() == "to-stderr"
    shown = show(home, failing)
    assert shown["state"] == "failed" and shown["exit_code"] == 3
    assert shown["cluster"]["name"] == "hpc" and shown["cluster"]["slurm_job_id"].isdigit()
    # Where each ran, from the wrapper's start record (Slurm forgets GPUs once a job ends).
    assert sorted(show(home, j)["cluster"]["gpu_ids"] for j in ids) == [[0], [1]]
    listing = home.run("ls", "--all").stdout
    assert f"hpc {shown['cluster']['slurm_job_id']} " in listing and "as of" in listing


def test_options_slurm_cannot_honour_are_refused_before_anything_is_queued(
    slurm, make_home, tmp_path
):
    home, root = cluster_home(make_home, slurm, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for args, cwd, said, status in (
        (["--gpu-mem", "20G"], root, "no GPU of cluster hpc has 20.0 GiB", 1),
        (["--gpu-ids", "1"], root, "--gpu-ids and --exclude-gpus name GPUs of this machine", 1),
        ([], elsewhere, f"the working directory {elsewhere} is not under", 1),
        (
            ["--cluster", "nosuch"],
            root,
            "no cluster 'nosuch' in the daemon's config; valid: local, hpc",
            2,
        ),
    ):
        refused = home.run("submit", "--cluster", "hpc", *args, "--", "true", cwd=cwd, check=False)
        assert refused.returncode == status, refused
        assert refused.stderr.startswith("Error: ") and said in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    assert home.run("ls", "--all").stdout.strip().count("\n") == 0  # the header alone


def test_default_cluster_makes_it_implicit_and_local_runs_here(slurm, make_home, tmp_path):
    home, root = cluster_home(make_home, slurm, tmp_path, default=True)
    remote = json.loads(home.run("submit", "--json", "--", "true", cwd=root).stdout)["id"]
    local = json.loads(
        home.run("submit", "--json", "--cluster", "local", "--", "true", cwd=root).stdout
    )["id"]
    home.run("wait", str(remote), str(local))
    assert show(home, remote)["cluster"]["slurm_job_id"]
    assert "cluster" not in show(home, local)


def test_the_wrapper_fails_a_job_whose_directory_is_gone_and_keeps_its_environment(
    slurm, make_home, tmp_path
):
    home, root = cluster_home(make_home, slurm, tmp_path)
    # SBATCH_* in the daemon's environment would override the job's options.
    home.run("daemon", "start", env={"SBATCH_TIMELIMIT": "7"})
    gone = root / "gone"
    gone.mkdir()
    lost_dir = _submit(home, gone, "--hold", "--", "true")
    gone.rmdir()
    home.run("release", str(lost_dir))
    ended = home.wait_state(lost_dir, "failed", "succeeded")
    assert (
        ended["state"] == "failed" and "cannot enter the working directory" in ended["end_reason"]
    )
    job_id = _submit(
        home,
        root,
        "--env",
        "FOO=a b\nc",
        "--",
        "bash",
        "-c",
        'printf "%s|" "$FOO"; sleep 2; echo done',
    )
    wait_until(lambda: show(home, job_id)["state"] == "running", "the job to run")
    key = show(home, job_id)["cluster"]["slurm_job_id"]
    shown = slurm.run("scontrol", "show", "job", key).stdout
    assert re.findall(r"TimeLimit=(\S+)", shown) == ["UNLIMITED"], shown
    followed = home.run("logs", "-f", str(job_id))  # follows until the job ends
    assert followed.stdout == "a b\nc|done\n"


def test_a_cluster_job_whose_cluster_left_the_config_is_cancelled_here_and_says_so(
    make_home, tmp_path
):
    # A [clusters.*] table removed while a job was handed over (as a system daemon's must
    # now be): cancel cannot reach Slurm, so it says what to do there, and never fails.
    bin_dir, shared = tmp_path / "bin", tmp_path / "shared"
    shared.mkdir()
    executable(bin_dir / "sbatch", "#!/bin/sh\necho 4242\n")
    for name in ("squeue", "sacct", "scancel"):
        executable(bin_dir / name, "#!/bin/sh\nexit 0\n")
    home = make_home()
    home.write_config(
        f'[clusters.hpc]\nshared_dir = "{shared}"\nbin_dir = "{bin_dir}"\nlost_grace = "1h"\n'
    )
    job_id = json.loads(home.run("submit", "--json", "--cluster", "hpc", "--", "true").stdout)["id"]
    wait_until(
        lambda: home.show(job_id)["cluster"]["slurm_job_id"] == "4242", "the job to be handed over"
    )
    home.run("daemon", "stop")
    home.write_config("")
    assert home.run("cancel", str(job_id)).stdout.strip() == f"job {job_id}: cancelled"
    job = home.show(job_id)
    assert (job["state"], job["end_reason"]) == (
        "cancelled",
        "cancelled by " + job["user"] + "; cluster hpc is not in the daemon's "
        "config, so Slurm was not told: scancel 4242 there",
    )
