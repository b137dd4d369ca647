"""`#SBATCH` lines in a submitted script are read as sbatch reads them: up to the first
command, with the command line's options winning; a line gpusched cannot honour is refused."""

from __future__ import annotations

import pytest

from conftest import executable

SCRIPT = """#!/bin/sh
#SBATCH -J from-script
#SBATCH --time=5 --gpus=1
# a plain comment
#SBATCH --hold
echo hi
#SBATCH --priority 9
"""


@pytest.mark.parametrize("env", [{}, {"GPUSCHED_NO_FAST_PATH": "1"}], ids=["fast", "typer"])
@pytest.mark.parametrize("runner", [[], ["bash"]], ids=["direct", "bash"])
def test_sbatch_lines_apply_and_the_command_line_wins(home, tmp_path, env, runner):
    home.start()
    executable(tmp_path / "job.sh", SCRIPT)
    out = home.run("submit", "--time", "7", "--", *runner, "./job.sh", cwd=tmp_path, env=env)
    job = home.show(int(out.stdout))
    assert (job["name"], job["time_limit_s"], job["held"]) == ("from-script", 420, True)
    assert (job["gpus_requested"], job["priority"]) == (1, 0)  # after `echo hi`: not read


@pytest.mark.parametrize(
    "line, says",
    [
        ("#SBATCH --mail-type=END", "is not an option gpusched reads"),
        ("#SBATCH -p gpu", "-p (Slurm's --partition) is not supported"),
    ],
)
def test_a_line_gpusched_cannot_honour_is_refused(home, tmp_path, line, says):
    executable(tmp_path / "job.sh", f"#!/bin/sh\n{line}\ntrue\n")
    proc = home.run("submit", "--", "./job.sh", cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"Error: '{line}' in ") and says in proc.stderr
