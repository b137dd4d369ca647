"""The shipped completion scripts match what the command line generates now."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpusched.completions import SHELLS

REPO = Path(__file__).resolve().parent.parent
FILES = {"bash": "completions/gpusched.bash", "zsh": "completions/_gpusched",
         "fish": "completions/gpusched.fish"}


def _generated(shell: str) -> str:
    return subprocess.run([sys.executable, "-m", "gpusched", "completions", shell], check=True,
                          capture_output=True, text=True, cwd=REPO).stdout


@pytest.mark.parametrize("shell", SHELLS)
def test_completion_files_are_not_stale(shell):
    shipped = (REPO / FILES[shell]).read_text()
    assert shipped == _generated(shell), (
        f"{FILES[shell]} is stale: run `gpusched completions {shell} > {FILES[shell]}`")


def test_bash_completion_offers_subcommands_and_options():
    if not shutil.which("bash"):
        pytest.skip("bash is not installed")
    script = (f"source {REPO / FILES['bash']}; "
              "COMP_WORDS=(gpusched daemon st); COMP_CWORD=2; _gpusched; echo ${COMPREPLY[@]}; "
              "COMP_WORDS=(gpusched submit --gpu); COMP_CWORD=2; _gpusched; echo ${COMPREPLY[@]}")
    lines = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    assert lines[0].split() == ["start", "status", "stop"]
    assert set(lines[1].split()) == {"--gpus", "--gpu-mem", "--gpu-ids", "--gpu-type"}


def test_unknown_shell_is_a_usage_error():
    proc = subprocess.run([sys.executable, "-m", "gpusched", "completions", "tcsh"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2
    assert proc.stderr.startswith("Error: no completions for 'tcsh'")
