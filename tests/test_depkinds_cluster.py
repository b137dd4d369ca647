"""Jobs handed to a Slurm cluster (--cluster) refuse singleton, aftercorr and `?` before
anything is queued (daemon/slurm/dependencies.py decides only all-of afterok, afterany, afternotok
and after), against a real one-node Slurm."""

from __future__ import annotations

import json

from slurmhome import cluster_home


def test_new_dependency_kinds_are_refused_for_a_cluster_job(slurm, make_home, tmp_path):
    home, root = cluster_home(make_home, slurm, tmp_path)
    parent = json.loads(
        home.run("submit", "--json", "--cluster", "hpc", "--hold", "--", "true", cwd=root).stdout
    )["id"]
    for deps, word in (
        ("singleton", "singleton"),
        (f"aftercorr:{parent}", "aftercorr"),
        (f"afterok:{parent}?afterany:{parent}", "'?' (any of)"),
    ):
        refused = home.run(
            "submit", "--cluster", "hpc", "-d", deps, "--", "true", cwd=root, check=False
        )
        assert refused.returncode == 2, refused  # a usage error, as the other dependencies
        assert refused.stderr.startswith(
            f"Error: --dependency {word} is not handed to a cluster (cluster hpc); run the job here"
        )
        assert len(refused.stderr.strip().splitlines()) == 1
    assert [j["id"] for j in json.loads(home.run("ls", "--all", "--json").stdout)] == [parent]
    home.run("cancel", str(parent))
