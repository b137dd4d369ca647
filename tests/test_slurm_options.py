"""sbatch's option letters mean what they mean in Slurm; what gpusched cannot honour, and
words before `--` that are neither options nor values, are refused in one line (exit 2)."""

from __future__ import annotations

import pytest

# Both of submit's parsers: the fast path, and typer's (GPUSCHED_NO_FAST_PATH=1).
PATHS = [{}, {"GPUSCHED_NO_FAST_PATH": "1"}]
PATH_IDS = ["fast", "typer"]


@pytest.mark.parametrize("env", PATHS, ids=PATH_IDS)
def test_slurm_letters_name_hold_and_chdir(home, tmp_path, env):
    home.start()
    where = tmp_path / "work"
    where.mkdir()
    out = home.run(
        "submit", "-J", "sweep", "-D", str(where), "-H", "-n", "1", "-N", "1", "--", "true", env=env
    )
    job = home.show(int(out.stdout))
    assert (job["name"], job["cwd"], job["state"]) == ("sweep", str(where), "pending")
    assert job["held"]


@pytest.mark.parametrize("env", PATHS, ids=PATH_IDS)
@pytest.mark.parametrize(
    "argv, says",
    [
        (["-n", "4"], "Error: --ntasks 4: a gpusched job is one task"),
        (["-N", "2"], "Error: --nodes 2: gpusched runs each job on this one machine"),
        (["-p", "gpu"], "Error: -p (Slurm's --partition) is not supported"),
        (["--partition=gpu"], "Error: --partition is not supported"),
        (["-w", "node1"], "Error: -w (Slurm's --nodelist) is not supported"),
        (["-q", "high"], "Error: -q (Slurm's --qos) is not supported"),
        (["--parsable"], "Error: --parsable is not supported: submit prints the job's id alone"),
    ],
)
def test_letters_slurm_gives_other_meanings_are_refused(home, env, argv, says):
    # Before the fix -n 4 named the job "4" and -e err.txt set a variable: both ran.
    proc = home.run("submit", *argv, "--", "true", check=False, env=env)
    assert proc.returncode == 2
    assert proc.stderr.startswith(says) and proc.stderr.count("\n") == 1
    assert proc.stdout == ""


@pytest.mark.parametrize("env", PATHS, ids=PATH_IDS)
def test_stray_words_before_the_double_dash_are_refused(home, env):
    home.start()
    first = home.submit("--", "true")
    proc = home.run(
        "submit", "-d", f"afterok:{first}", "69", "70", "--", "true", check=False, env=env
    )
    assert proc.returncode == 2, proc.stdout
    assert proc.stderr.startswith("Error: '69 70' before `--` is neither an option nor its value")
    assert [j["id"] for j in home.jobs()] == [first]  # nothing was queued


def test_a_command_without_double_dash_still_runs(home):
    home.start()
    job_id = int(home.run("submit", "sh", "-c", "exit 3").stdout)
    assert home.wait_state(job_id, "failed")["exit_code"] == 3
