"""Cluster jobs end to end against a real one-node Slurm: submit, ls, show, wait, logs, cancel."""

from __future__ import annotations

import json

from conftest import wait_until
from slurmhome import cluster_home, show
from slurmnode import slurm  # noqa: F401 - the fixture


def _submit(home, root, *args: str) -> int:
    out = home.run("submit", "--json", "--cluster", "hpc", *args, cwd=root)
    return json.loads(out.stdout)["id"]


def test_two_gpu_jobs_get_distinct_gpus_and_wait_returns_the_exit_status(
        slurm, make_home, tmp_path):  # noqa: F811
    home, root = cluster_home(make_home, slurm, tmp_path)
    ids = [_submit(home, root, "--gpus", "1", "--", "bash", "-c",
                   'echo "gpus=$SLURM_JOB_GPUS job=$GPUSCHED_JOB_ID"; sleep 1') for _ in range(2)]
    failing = _submit(home, root, "--", "bash", "-c", "echo to-stderr >&2; exit 3")
    waited = home.run("wait", str(failing), check=False)
    assert waited.returncode == 3, waited.stderr
    for job_id in ids:
        assert home.run("wait", str(job_id), check=False).returncode == 0
    outputs = {home.run("logs", str(j)).stdout.strip() for j in ids}
    assert outputs == {f"gpus=0 job={ids[0]}", f"gpus=1 job={ids[1]}"} or \
        outputs == {f"gpus=1 job={ids[0]}", f"gpus=0 job={ids[1]}"}
    assert home.run("logs", "--stderr", str(failing)).stdout.strip() == "to-stderr"
    shown = show(home, failing)
    assert shown["state"] == "failed" and shown["exit_code"] == 3
    assert shown["cluster"]["name"] == "hpc" and shown["cluster"]["slurm_job_id"].isdigit()
    listing = home.run("ls", "--all").stdout
    assert f"hpc {shown['cluster']['slurm_job_id']} " in listing and "as of" in listing
