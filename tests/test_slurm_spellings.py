"""sbatch's spellings a Slurm user types: --gres, --gpus-per-node, --nice, --export,
--no-requeue; and the ones gpusched refuses (--requeue) say what to use."""

from __future__ import annotations

import pytest


def test_gres_gpus_per_node_and_nice(home):
    home.start()
    by_gres = home.show(home.submit("--hold", "--gres", "gpu:2", "--nice", "5", "--", "true"))
    per_node = home.show(home.submit("--hold", "--gpus-per-node=1", "--no-requeue", "--", "true"))
    assert (by_gres["gpus_requested"], by_gres["priority"]) == (2, -5)
    assert per_node["gpus_requested"] == 1


@pytest.mark.parametrize(
    "export, expected", [("NONE,FOO=1", {"FOO": "1"}), ("FOO=1,HOME", {"FOO": "1", "HOME": "here"})]
)
def test_export_lists_only_what_it_names(home, export, expected):
    home.start()
    job_id = home.run(
        "submit", "--hold", "--export", export, "--", "true", env={"HOME": "here", "OTHER": "x"}
    ).stdout.strip()
    submitted = home.run("env", job_id).stdout
    got = dict(line.split("=", 1) for line in submitted.splitlines())
    assert got == expected


def test_export_all_keeps_the_environment_and_adds(home):
    home.start()
    job_id = home.submit("--hold", "--export", "ALL,FOO=1", "--", "true")
    got = dict(line.split("=", 1) for line in home.run("env", str(job_id)).stdout.splitlines())
    assert got["FOO"] == "1" and got["GPUSCHED_HOME"] == str(home.path)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--requeue"], "Error: --requeue is not supported"),
        (["--gres", "tpu:1"], "Error: --gres 'tpu:1': only GPUs"),
    ],
)
def test_spellings_gpusched_cannot_honour_are_refused(home, argv, says):
    proc = home.run("submit", *argv, "--", "true", check=False)
    assert proc.returncode == 2 and proc.stderr.startswith(says)
