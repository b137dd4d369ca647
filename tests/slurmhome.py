"""A gpusched home whose config names the test's one-node Slurm as cluster "hpc"."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import executable

# Short intervals: the tests poll a local controller, not a busy production one.
CLUSTER_CONFIG = """\
[clusters.hpc]
backend = "slurm"
partition = "debug"
shared_dir = "{shared}"
shared_roots = ["{root}"]
gpu_types = {{}}
slurm_conf = "{conf}"
bin_dir = "{bin_dir}"
poll_min = "0.3s"
poll_max = "1s"
lost_grace = "{lost_grace}"
"""
COMMANDS = ("sbatch", "squeue", "sacct", "scancel")


def logging_commands(bin_dir: Path, log: Path, sbatch_extra: str = "") -> Path:
    """Wrappers for the Slurm commands that log each call (one JSON line: the command and
    its arguments) and then run the real one: how the tests count the daemon's calls."""
    for name in COMMANDS:
        extra = sbatch_extra if name == "sbatch" else ""
        executable(
            bin_dir / name,
            f"""#!/bin/bash
printf '%s\\n' "$(date +%s.%N) {name} $*" >> {log}
/usr/bin/{name} "$@"
rc=$?
{extra}
exit $rc
""",
        )
    return bin_dir


def cluster_home(
    make_home,
    slurm,
    tmp_path: Path,
    lost_grace: str = "5s",
    sbatch_extra: str = "",
    default: bool = False,
):
    """A home with cluster "hpc" (its commands logged to tmp_path/calls.log), and its root
    for working directories (a directory the compute node sees: here, the same machine)."""
    shared, root = tmp_path / "shared", tmp_path / "work"
    shared.mkdir()
    root.mkdir()
    bin_dir = logging_commands(tmp_path / "slurmbin", tmp_path / "calls.log", sbatch_extra)
    home = make_home(name="clusterhome")
    text = CLUSTER_CONFIG.format(
        shared=shared, root=root, conf=slurm.conf, bin_dir=bin_dir, lost_grace=lost_grace
    )
    home.write_config(('default_cluster = "hpc"\n' if default else "") + text)
    return home, root


def calls(tmp_path: Path) -> list[list[str]]:
    log = tmp_path / "calls.log"
    return [line.split()[1:] for line in log.read_text().splitlines()] if log.exists() else []


def show(home, job_id: int) -> dict:
    return json.loads(home.run("show", "--json", str(job_id)).stdout)
