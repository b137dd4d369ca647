"""The one-node Slurm that the Slurm tests run against works as a real cluster would."""

from __future__ import annotations


from conftest import wait_until
from slurmnode import slurm  # noqa: F401 - the fixture


def _job_state(node, job_id: str) -> str:
    shown = node.run("scontrol", "show", "job", job_id, check=False).stdout
    return next((word.split("=", 1)[1] for word in shown.split() if word.startswith("JobState=")), "")


def test_two_jobs_get_distinct_gpus_and_exit_codes_are_kept(slurm, tmp_path):  # noqa: F811
    out = tmp_path / "%j.out"
    ids = [slurm.run("sbatch", "--parsable", "--gres=gpu:1", f"--output={out}", f"--chdir={tmp_path}",
                     "--wrap", 'echo "GPUS=$SLURM_JOB_GPUS"; sleep 2').stdout.strip()
           for _ in range(2)]
    failing = slurm.run("sbatch", "--parsable", f"--output={out}", "--wrap", "exit 3").stdout.strip()
    wait_until(lambda: all(_job_state(slurm, j) in ("COMPLETED", "FAILED") for j in ids + [failing]),
               "the three Slurm jobs to end")
    gpus = {(tmp_path / f"{j}.out").read_text().strip() for j in ids}
    assert gpus == {"GPUS=0", "GPUS=1"}
    assert _job_state(slurm, failing) == "FAILED"
    assert "ExitCode=3:0" in slurm.run("scontrol", "show", "job", failing).stdout
