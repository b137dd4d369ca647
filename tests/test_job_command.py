"""The job's command as a user types it: found on the submitter's PATH, or a reason in words.

Through the installed console script, with only what a user's shell would export: the
suite once passed while the README's own example failed from a virtualenv.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CONSOLE_SCRIPT, Home, executable

pytestmark = pytest.mark.e2e

SYSTEM_PATH = "/usr/bin:/bin"


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One daemon for the module, started by the first command that needs it."""
    home = Home(tmp_path_factory.mktemp("command") / "home")
    home.write_config()
    yield home
    home.cleanup()


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A real virtualenv (no pip: only its python matters)."""
    path = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120
    )
    return path


def submitted_id(proc: subprocess.CompletedProcess) -> int:
    """The id `submit` printed (first, before any --wait)."""
    return int(proc.stdout.split()[0])


def output(home: Home, job_id: int, stream: str = "stdout") -> str:
    return Path(home.show(job_id)[f"{stream}_path"]).read_text()


def test_the_readme_example_runs_the_virtualenvs_python(shared, venv, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("import sys\nprint(sys.prefix)\n")
    env = shared.user_env(path=f"{venv / 'bin'}:{SYSTEM_PATH}")
    # Verbatim, then `wait` for its status.
    job_id = submitted_id(
        shared.script("submit", "--gpus", "1", "--", "python", "train.py", env=env, cwd=project)
    )
    waited = shared.script("wait", str(job_id), env=env, cwd=project, check=False)
    assert waited.returncode == 0, (waited.stderr, shared.show(job_id)["end_reason"])
    assert Path(output(shared, job_id).strip()).resolve() == venv.resolve()


def test_a_script_on_the_callers_path_only(shared, tmp_path):
    my_bin = tmp_path / "bin"  # like ~/bin: on the user's PATH, not the daemon's
    executable(my_bin / "greet", '#!/bin/sh\necho "hello $1 from $0"\n')
    env = shared.user_env(path=f"{my_bin}:{SYSTEM_PATH}")
    proc = shared.script("submit", "--wait", "--", "greet", "you", env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    # The shell's way: the program is found on PATH, its name is what was typed.
    assert output(shared, submitted_id(proc)) == f"hello you from {my_bin}/greet\n"


def test_torchrun_from_the_environments_bin(shared, tmp_path):
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "torchrun").exists():
        pytest.skip("torchrun comes with the `jobs` extra (torch)")
    (tmp_path / "rank.py").write_text(
        "import os, sys\nprint(os.environ['RANK'], os.environ['WORLD_SIZE'], sys.prefix)\n"
    )
    env = shared.user_env(path=f"{bin_dir}:{SYSTEM_PATH}")
    proc = shared.script(
        "submit",
        "--wait",
        "--gpus",
        "1",
        "--",
        "torchrun",
        "--standalone",
        "--nproc-per-node",
        "1",
        "rank.py",
        env=env,
        cwd=tmp_path,
        check=False,
        timeout=180,
    )
    job_id = submitted_id(proc)
    assert proc.returncode == 0, (proc.stderr, output(shared, job_id, "stderr"))
    assert output(shared, job_id).split() == ["0", "1", sys.prefix]


def test_env_path_changes_where_the_command_is_found(shared, tmp_path):
    for name in ("first", "second"):
        executable(tmp_path / name / "where", f"#!/bin/sh\necho {name}\n")
    env = shared.user_env(path=f"{tmp_path / 'first'}:{SYSTEM_PATH}")
    plain = shared.script("submit", "--wait", "--", "where", env=env)
    moved = shared.script(
        "submit",
        "--wait",
        "--env",
        f"PATH={tmp_path / 'second'}:{SYSTEM_PATH}",
        "--",
        "where",
        env=env,
    )
    assert output(shared, submitted_id(plain)) == "first\n"
    assert output(shared, submitted_id(moved)) == "second\n"


# -- jobs that cannot start say why, in words ------------------------------------------------


def assert_cannot_start(home: Home, proc: subprocess.CompletedProcess, why: str) -> None:
    """The job failed with 127, and `why` is in its end reason, in the note in its stderr
    log, and in one line from `submit --wait` and from `wait`."""
    job_id = submitted_id(proc)
    line = f"Error: job {job_id} could not start: {why}\n"
    assert (proc.returncode, proc.stderr) == (127, line)
    job = home.show(job_id)
    assert (job["state"], job["exit_code"], job["end_reason"]) == (
        "failed",
        127,
        f"cannot start: {why}",
    )
    assert output(home, job_id, "stderr") == f"gpusched: cannot start: {why}\n"
    waited = home.script("wait", str(job_id), check=False)
    assert (waited.returncode, waited.stderr) == (127, line)


def test_a_mistyped_command_is_named_with_the_path_searched(shared):
    proc = shared.script("submit", "--wait", "--", "pyhton", "train.py", check=False)
    assert_cannot_start(shared, proc, f"no such command 'pyhton' in PATH ({SYSTEM_PATH})")


def test_a_script_that_is_not_executable(shared, tmp_path):
    executable(tmp_path / "run.sh", "#!/bin/sh\necho ran\n", mode=0o644)
    proc = shared.script("submit", "--wait", "--", "./run.sh", cwd=tmp_path, check=False)
    assert_cannot_start(shared, proc, f"{tmp_path}/run.sh is not executable (permission denied)")


def test_a_script_whose_interpreter_is_missing(shared, tmp_path):
    executable(tmp_path / "run.py", "#!/no/such/python3\nprint('ran')\n")
    proc = shared.script("submit", "--wait", "--", "./run.py", cwd=tmp_path, check=False)
    assert_cannot_start(
        shared,
        proc,
        f"{tmp_path}/run.py names an interpreter that does not exist: /no/such/python3",
    )


def test_a_working_directory_deleted_before_the_job_starts(shared, tmp_path):
    doomed = tmp_path / "doomed"
    doomed.mkdir()
    job_id = submitted_id(shared.script("submit", "--hold", "--", "true", cwd=doomed))
    doomed.rmdir()
    shared.script("release", str(job_id))
    waited = shared.script("wait", str(job_id), check=False)
    why = f"working directory {doomed} no longer exists"
    assert (waited.returncode, waited.stderr) == (
        127,
        f"Error: job {job_id} could not start: {why}\n",
    )
    assert shared.show(job_id)["end_reason"] == f"cannot start: {why}"
    assert output(shared, job_id, "stderr") == f"gpusched: cannot start: {why}\n"


# -- submitting from nowhere -----------------------------------------------------------------

# The fast path, and (with -G0, which only the full parser reads) the typer command.
PARSERS = [pytest.param([], id="fast-path"), pytest.param(["-G0"], id="typer")]


def from_deleted_cwd(home: Home, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`gpusched ARGS` started in a directory that is deleted first, as after `rm -r` of
    the directory a shell is still in."""
    gone = tmp_path / "gone"
    gone.mkdir()
    return subprocess.run(
        [
            "sh",
            "-c",
            'cd "$1" && rmdir "$1" && shift && exec "$@"',
            "sh",
            str(gone),
            str(CONSOLE_SCRIPT),
            *args,
        ],
        capture_output=True,
        text=True,
        env=home.user_env(),
        timeout=60,
    )


@pytest.mark.parametrize("parser", PARSERS)
def test_submit_from_a_deleted_directory_is_one_line(shared, tmp_path, parser):
    proc = from_deleted_cwd(shared, tmp_path, "submit", *parser, "--", "true")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "Error: the current directory no longer exists (was it deleted?), "
        "and a job runs where it is submitted. cd to a directory that "
        "exists, or give --cwd DIR\n"
    )
    relative = from_deleted_cwd(shared, tmp_path, "submit", *parser, "--cwd", "sub", "--", "true")
    assert relative.returncode == 2
    assert relative.stderr.startswith(
        "Error: --cwd sub is relative to the current directory, which no longer exists"
    )
    assert relative.stderr.count("\n") == 1
    # An absolute --cwd needs no current directory.
    fine = from_deleted_cwd(
        shared, tmp_path, "submit", *parser, "--cwd", str(tmp_path), "--", "true"
    )
    assert fine.returncode == 0, fine.stderr


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("cwd", ["/nonexistent", "missing"])
def test_cwd_that_does_not_exist_is_one_line(shared, tmp_path, parser, cwd):
    proc = shared.script("submit", *parser, "--cwd", cwd, "--", "true", cwd=tmp_path, check=False)
    where = cwd if cwd.startswith("/") else f"{tmp_path}/{cwd}"
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == f"Error: --cwd {where} does not exist. Give a directory that exists\n"
