"""The fast paths (submit, ls, show, gpus, wait, cancel, logs, hold, release) import none
of the standard library's slow modules (issue 15): each of re, enum, json, socket,
selectors, collections, functools, signal costs a command more than its whole budget of
twice `python -c pass`. Seen from the real console script's code against a real daemon,
as sys.modules holds them when the command exits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SLOW = {
    "re",
    "enum",
    "json",
    "socket",
    "selectors",
    "collections",
    "functools",
    "signal",
    "typing",
    "dataclasses",
    "pathlib",
    "inspect",
    "shlex",
    "struct",
    "typer",
    "click",
    "rich",
}
# What a console script runs (pip's own also imports re for itself, which a command cannot
# help; uv's does not), under -S: without site, whose .pth hooks import some slow modules
# themselves. The fast path ends in os._exit, so the modules are listed there.
CONSOLE_SCRIPT = """
import os, sys
exit_now = os._exit
def list_modules_and_exit(status):
    sys.stderr.write("MODULES " + " ".join(sorted(sys.modules)) + "\\n")
    sys.stderr.flush()
    exit_now(status)
os._exit = list_modules_and_exit
sys.argv[0] = "gpusched"
from gpusched.cli.entry import main
sys.exit(main())
"""


def modules_at_exit(home, *args: str) -> tuple[set[str], subprocess.CompletedProcess]:
    proc = subprocess.run(
        [sys.executable, "-S", "-c", CONSOLE_SCRIPT, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=home.path,
        env={**home.env, "PYTHONPATH": str(REPO)},
    )
    lines = [line for line in proc.stderr.splitlines() if line.startswith("MODULES ")]
    assert lines, (args, proc.stderr)
    return set(lines[-1].split()[1:]), proc


def test_every_fast_command_imports_none_of_the_slow_modules(home):
    home.start()
    ended = home.submit("--", "echo", "hello")
    home.wait_state(ended, "succeeded")
    held = home.submit("--hold", "--", "true")
    other = home.submit("--hold", "--", "true")
    commands = [
        ["submit", "--hold", "--", "true"],
        [
            "submit",
            "--gpus",
            "1",
            "--time",
            "1:30:00",
            "--gpu-mem",
            "10G",
            "--mem",
            "4G",
            "--array",
            "0-3%2",
            "--hold",
            "--",
            "python",
            "train.py",
        ],
        ["ls"],
        ["ls", "--all", "--format", "jobid,state,command"],
        ["ls", "--last", "2"],
        ["show", str(ended)],
        ["gpus"],
        ["gpus", "--query", "index,name", "--format", "csv"],
        ["wait", str(ended)],
        ["logs", str(ended)],
        ["hold", str(held)],
        ["release", str(held)],
        ["cancel", str(other)],
    ]
    for args in commands:
        loaded, proc = modules_at_exit(home, *args)
        assert proc.returncode == 0, (args, proc.stderr)
        assert "gpusched.cli.app" not in loaded, args  # the fast path answered, not typer
        top_level = {name.split(".")[0] for name in loaded}
        assert not SLOW & top_level, (args, sorted(SLOW & top_level))
    # The answers are the usual ones.
    assert modules_at_exit(home, "logs", str(ended))[1].stdout == "hello\n"
    assert home.show(other)["state"] == "cancelled"


def test_the_typer_path_still_answers(home):
    home.start()
    job = home.submit("--", "true")
    env = {"GPUSCHED_NO_FAST_PATH": "1"}
    home.wait_state(job, "succeeded")
    out = home.run("ls", "--all", env=env).stdout
    assert f"{job} " in out and "succeeded" in out
    assert home.run("show", str(job), env=env).returncode == 0


def test_a_bad_job_id_still_reads_as_before(home):
    # The id is read with str methods now: the same refusal, on both paths.
    for env in ({}, {"GPUSCHED_NO_FAST_PATH": "1"}):
        proc = home.run("show", "4_", check=False, env=env)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr == (
            "Error: '4_' is not a job id; give an ID like 12, or "
            "ARRAY_INDEX like 12_3 for one element of array 12\n"
        )


# Needed only for the options that name them: --time, --mem, --after, --array... (the
# parsers of core.syntax and what it imports), -o/-e, --from-file; for a refusal (the
# user name of a socket's owner); and the extension modules a plain submit has no use for
# (each load costs it a quarter of a millisecond or more: math for sizes' infinity, fcntl
# for the lock a starting daemon takes).
NOT_FOR_A_PLAIN_SUBMIT = {
    "gpusched.core.spec.syntax",
    "gpusched.core.spec.values",
    "gpusched.client.submit.sweepfile",
    "gpusched.client.submit.outputs",
    "gpusched.core.spec.outpattern",
    "gpusched.core.users",
    "math",
    "fcntl",
}


def test_a_plain_submit_loads_only_what_it_uses(home):
    home.start()
    loaded, proc = modules_at_exit(home, "submit", "--hold", "--", "true")
    assert proc.returncode == 0, proc.stderr
    assert not NOT_FOR_A_PLAIN_SUBMIT & loaded, sorted(NOT_FOR_A_PLAIN_SUBMIT & loaded)
    # The options that need them still load them, and are read as before.
    loaded, proc = modules_at_exit(
        home,
        "submit",
        "--hold",
        "--time",
        "1:00",
        "-o",
        "out.txt",
        "--after",
        proc.stdout.strip(),
        "--",
        "true",
    )
    assert proc.returncode == 0, proc.stderr
    assert {"gpusched.core.spec.syntax", "gpusched.client.submit.outputs"} <= loaded
    job = home.show(int(proc.stdout))
    assert job["time_limit_s"] == 60 and job["dependencies"] and job["held"]
