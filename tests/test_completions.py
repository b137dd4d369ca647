"""The shipped completion scripts match what the command line generates now."""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpusched.cli.completions import SHELLS

REPO = Path(__file__).resolve().parent.parent
FILES = {
    "bash": "completions/gpusched.bash",
    "zsh": "completions/_gpusched",
    "fish": "completions/gpusched.fish",
}


def _generated(shell: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "gpusched", "completions", shell],
        check=True,
        capture_output=True,
        text=True,
        cwd=REPO,
    ).stdout


@pytest.mark.e2e
@pytest.mark.parametrize("shell", SHELLS)
def test_completion_files_are_not_stale(shell):
    shipped = (REPO / FILES[shell]).read_text()
    assert shipped == _generated(shell), (
        f"{FILES[shell]} is stale: run `gpusched completions {shell} > {FILES[shell]}`"
    )


@pytest.mark.e2e
def test_bash_completion_offers_subcommands_and_options():
    if not shutil.which("bash"):
        pytest.skip("bash is not installed")
    script = (
        f"source {REPO / FILES['bash']}; "
        "COMP_WORDS=(gpusched daemon st); COMP_CWORD=2; _gpusched; echo ${COMPREPLY[@]}; "
        "COMP_WORDS=(gpusched submit --gpu); COMP_CWORD=2; _gpusched; echo ${COMPREPLY[@]}"
    )
    lines = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert lines[0].split() == ["start", "status", "stop"]
    assert set(lines[1].split()) == {
        "--gpus",
        "--gpu-mem",
        "--gpu-mem-over",
        "--gpu-ids",
        "--gpu-type",
        "--gpus-per-node",
    }


@pytest.mark.e2e
def test_unknown_shell_is_a_usage_error():
    proc = subprocess.run(
        [sys.executable, "-m", "gpusched", "completions", "tcsh"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("Error: no completions for 'tcsh'")


# -- job ids, against a real daemon ---------------------------------------------------------


def gpusched_on_path(directory: Path) -> str:
    """A `gpusched` command as the console script installs it, first on a PATH."""
    directory.mkdir(exist_ok=True)
    script = directory / "gpusched"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m gpusched "$@"\n')
    script.chmod(0o755)
    return f"{directory}:{os.environ.get('PATH', os.defpath)}"


@pytest.fixture
def jobs(home, tmp_path):
    """A home with a finished, a running and a held job, and `gpusched` on PATH."""
    gate = tmp_path / "go"
    home.done = home.submit("--", "true")
    home.busy = home.submit(
        "--gpus",
        "1",
        "--name",
        "train",
        "--",
        "sh",
        "-c",
        f"while [ ! -e {gate} ]; do sleep 0.05; done",
    )
    home.held = home.submit("--hold", "--", "true")
    home.wait_state(home.done, "succeeded")
    home.wait_state(home.busy, "running")
    home.env["PATH"] = gpusched_on_path(tmp_path / "bin")
    yield home
    gate.touch()


def bash_complete(home, *words: str) -> list[str]:
    """What Tab offers in bash after `words` (the last one is being typed)."""
    script = (
        f"source {REPO / FILES['bash']}; COMP_WORDS=({' '.join(map(shlex.quote, words))}); "
        'COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _gpusched; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    proc = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, check=True, env=home.env
    )
    return [line for line in proc.stdout.splitlines() if line]


@pytest.mark.skipif(not shutil.which("bash"), reason="bash is not installed")
def test_bash_completes_job_ids_from_the_daemon(jobs):
    every = sorted(map(str, (jobs.done, jobs.busy, jobs.held)))
    assert sorted(bash_complete(jobs, "gpusched", "show", "")) == every
    assert sorted(bash_complete(jobs, "gpusched", "resubmit", "")) == every
    # Commands that change a queued job offer only the jobs still queued or running.
    assert sorted(bash_complete(jobs, "gpusched", "cancel", "")) == sorted(
        map(str, (jobs.busy, jobs.held))
    )
    assert bash_complete(jobs, "gpusched", "show", str(jobs.held)) == [str(jobs.held)]
    assert bash_complete(jobs, "gpusched", "update", "1", "--priority", "") == []
    assert bash_complete(jobs, "gpusched", "completions", "") == ["bash", "zsh", "fish"]
    assert bash_complete(jobs, "gpusched", "ls", "--stat") == ["--state"]


def test_job_ids_helper_lists_ids_and_says_nothing_without_a_daemon(jobs, tmp_path):
    proc = jobs.run("_job-ids", "active")
    assert proc.stdout == f"{jobs.busy}\trunning train\n{jobs.held}\tpending true\n"
    assert proc.stderr == ""
    jobs.run("daemon", "stop")
    for args in (["_job-ids", "all"], ["_job-ids", "bogus"], ["_job-ids"]):
        proc = jobs.run(*args, check=False)
        assert proc.returncode != 0 and proc.stdout == proc.stderr == ""
    assert jobs.run("daemon", "status", check=False).returncode == 3  # none was started


@pytest.mark.skipif(not shutil.which("zsh"), reason="zsh is not installed")
def test_zsh_completes_job_ids_and_shells(jobs):
    # The completion function with zsh's completion builtins replaced by ones that print
    # what they are given: enough to check its logic outside a terminal.
    stubs = (
        'compadd() { [[ $1 == -- ]] && shift; print -rl -- "$@" }; '
        '_describe() { print -rl -- "${(@P)2}" }; _files() { print FILES }; '
        "_normal() { print NORMAL }"
    )

    def complete(*words: str) -> list[str]:
        script = (
            f"{stubs}; source {REPO / FILES['zsh']} >/dev/null; "
            f"words=({' '.join(map(shlex.quote, words))}); CURRENT=${{#words}}; "
            f"PREFIX={shlex.quote(words[-1])}; _gpusched"
        )
        proc = subprocess.run(
            ["zsh", "-f", "-c", script], capture_output=True, text=True, env=jobs.env
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.splitlines()

    assert complete("gpusched", "show", "") == [
        f"{jobs.done}:succeeded true",
        f"{jobs.busy}:running train",
        f"{jobs.held}:pending true",
    ]
    assert complete("gpusched", "completions", "") == ["bash", "zsh", "fish"]
    assert complete("gpusched", "update", "1", "--priority", "") == ["FILES"]
    assert "start:Start the daemon in the background." in complete("gpusched", "daemon", "")


@pytest.mark.skipif(not shutil.which("fish"), reason="fish is not installed")
def test_fish_completes_job_ids_and_shells(jobs, tmp_path):
    def complete(line: str) -> list[str]:
        script = f"source {REPO / FILES['fish']}; complete -C {shlex.quote(line)}"
        proc = subprocess.run(
            ["fish", "--no-config", "-c", script],
            capture_output=True,
            text=True,
            env={**jobs.env, "HOME": str(tmp_path)},
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.splitlines()

    assert f"{jobs.busy}\trunning train" in complete("gpusched show ")
    assert f"{jobs.done}\tsucceeded true" not in complete("gpusched cancel ")
    assert sorted(complete("gpusched completions ")) == ["bash", "fish", "zsh"]


# -- the README's install steps, on a fresh account -------------------------------------------


def readme_install_lines() -> list[str]:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Shell completions", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


@pytest.fixture
def fresh_account(tmp_path):
    """A home as `useradd -m` makes it (from /etc/skel), with the README's steps run in it
    and `gpusched` on PATH."""
    home = tmp_path / "fresh"
    if Path("/etc/skel").is_dir():
        shutil.copytree("/etc/skel", home)
    else:
        home.mkdir()
    home.chmod(0o700)
    env = {
        "HOME": str(home),
        "PATH": gpusched_on_path(tmp_path / "bin"),
        "TERM": "dumb",
        "PYTHONPATH": str(REPO),
        "GPUSCHED_HOME": str(tmp_path / "gpusched"),
    }
    subprocess.run(
        ["sh", "-e", "-c", "\n".join(readme_install_lines())],
        env=env,
        check=True,
        cwd=home,
        capture_output=True,
    )
    return env


BASH_COMPLETION = Path("/usr/share/bash-completion/bash_completion")


@pytest.mark.system
@pytest.mark.skipif(
    not BASH_COMPLETION.exists(), reason="the bash-completion package is not installed"
)
def test_readme_steps_give_bash_completion_on_a_fresh_account(fresh_account):
    # An interactive bash reads ~/.bashrc; bash-completion (through it, or sourced here when
    # the skeleton .bashrc does not) loads ours from the user directory on first use.
    script = (
        f"type __load_completion >/dev/null 2>&1 || source {BASH_COMPLETION}; "
        "__load_completion gpusched; complete -p gpusched; "
        "COMP_WORDS=(gpusched daemon st); COMP_CWORD=2; _gpusched; echo ${COMPREPLY[@]}"
    )
    proc = subprocess.run(
        ["bash", "-i", "-c", script],
        env=fresh_account,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    lines = proc.stdout.splitlines()
    assert lines[0] == "complete -o default -F _gpusched gpusched", proc.stdout + proc.stderr
    assert lines[1] == "start status stop"


@pytest.mark.system
@pytest.mark.skipif(not shutil.which("zsh"), reason="zsh is not installed")
def test_readme_steps_give_zsh_completion_on_a_fresh_account(fresh_account):
    proc = subprocess.run(
        ["zsh", "-i", "-c", "print -r -- $_comps[gpusched]"],
        env=fresh_account,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout.splitlines()[-1:] == ["_gpusched"], proc.stdout + proc.stderr


@pytest.mark.system
@pytest.mark.skipif(not shutil.which("fish"), reason="fish is not installed")
def test_readme_steps_give_fish_completion_on_a_fresh_account(fresh_account):
    proc = subprocess.run(
        ["fish", "-c", "complete -C 'gpusched daemon st'"],
        env=fresh_account,
        capture_output=True,
        text=True,
    )
    assert [line.split("\t")[0] for line in proc.stdout.splitlines()] == [
        "start",
        "status",
        "stop",
    ], proc.stdout + proc.stderr
