"""The one-node Slurm that the Slurm tests run against works as a real cluster would."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from conftest import REPO, is_gone, wait_until
from slurmnode import unavailable_reason


def _job_state(node, job_id: str) -> str:
    shown = node.run("scontrol", "show", "job", job_id, check=False).stdout
    return next(
        (word.split("=", 1)[1] for word in shown.split() if word.startswith("JobState=")), ""
    )


def test_two_jobs_get_distinct_gpus_and_exit_codes_are_kept(slurm, tmp_path):
    out = tmp_path / "%j.out"
    ids = [
        slurm.run(
            "sbatch",
            "--parsable",
            "--gres=gpu:1",
            f"--output={out}",
            f"--chdir={tmp_path}",
            "--wrap",
            'echo "GPUS=$SLURM_JOB_GPUS"; sleep 2',
        ).stdout.strip()
        for _ in range(2)
    ]
    failing = slurm.run(
        "sbatch", "--parsable", f"--output={out}", "--wrap", "exit 3"
    ).stdout.strip()
    wait_until(
        lambda: all(_job_state(slurm, j) in ("COMPLETED", "FAILED") for j in ids + [failing]),
        "the three Slurm jobs to end",
    )
    gpus = {(tmp_path / f"{j}.out").read_text().strip() for j in ids}
    assert gpus == {"GPUS=0", "GPUS=1"}
    assert _job_state(slurm, failing) == "FAILED"
    assert "ExitCode=3:0" in slurm.run("scontrol", "show", "job", failing).stdout


def test_the_recipe_in_contrib_starts_a_node_that_gpusched_hands_jobs_to(make_home, tmp_path):
    """docs/slurm.md's way to try the hand-off on one machine, run as a user would."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    # munged wants every directory above its socket open to all: not tmp_path (0700).
    root = Path(tempfile.mkdtemp(prefix="gs-onenode-"))
    os.chmod(root, 0o755)
    script, base = REPO / "contrib" / "slurm" / "onenode.py", root / "slurm1"
    started = subprocess.run(
        [sys.executable, str(script), "start", str(base)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    pids = [int(p.read_text()) for p in (base / "run").glob("*.pid") if p.read_text().strip()]
    try:
        assert started.returncode == 0, started.stderr
        assert len(pids) == 3  # munged, slurmctld, slurmd
        table = started.stdout.split("[clusters.local1]\n", 1)[1].split("\n\n", 1)[0]
        home = make_home()
        home.write_config("[clusters.local1]\n" + textwrap.dedent(table))
        done = home.run(
            "submit",
            "--cluster",
            "local1",
            "--wait",
            "--",
            "sh",
            "-c",
            "exit 3",
            check=False,
            cwd=tmp_path,
        )
        assert done.returncode == 3, done.stderr
    finally:
        stopped = subprocess.run(
            [sys.executable, str(script), "stop", str(base)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert stopped.returncode == 0, stopped.stderr
    wait_until(lambda: all(is_gone(pid) for pid in pids), "the Slurm daemons to stop")
    shutil.rmtree(root, ignore_errors=True)
