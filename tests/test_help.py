"""`--help` as a person reads it: placeholders that name what to type, an example for every
command, 80 columns, `-h` everywhere, and the help for `gpusched` alone."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys

import pytest
import typer

from conftest import REPO, Home
from gpusched.cli import app as cli
from gpusched.cli.completions import Node, tree


def _commands(node: Node) -> list[tuple[str, ...]]:
    return [node.path, *(p for child in node.children for p in _commands(child))]


COMMANDS = _commands(tree(typer.main.get_command(cli.app)))
PYTHON_TYPE = re.compile(r"<\w+(\[[\w\[\], ]*\])?>")  # <int>, <str>, <list[str]>
BRACES = re.compile(r"\{\w+\}")  # {job_id}
CLICK_TYPE = re.compile(r"\b(INTEGER|TEXT|FLOAT|BOOLEAN|FILENAME)\b")


def help_text(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main([*args, "--help"]) == 0
    return out.getvalue()


def test_the_walk_sees_every_command():
    assert {
        ("submit",),
        ("resubmit",),
        ("ls",),
        ("show",),
        ("daemon",),
        ("daemon", "start"),
    } <= set(COMMANDS)
    assert ("_job-ids",) not in COMMANDS  # hidden: the completion helper


@pytest.mark.parametrize("path", COMMANDS, ids=[" ".join(p) or "gpusched" for p in COMMANDS])
def test_help_names_what_to_type_has_an_example_and_fits_80_columns(path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    text = help_text(*path)
    assert not PYTHON_TYPE.search(text), PYTHON_TYPE.search(text).group()
    assert not BRACES.search(text), BRACES.search(text).group()
    assert not CLICK_TYPE.search(text), CLICK_TYPE.search(text).group()
    assert re.search(rf"Examples?:\s+(sudo |\S+=\S+ )?gpusched {' '.join(path)}".rstrip(), text), (
        f"no example of `gpusched {' '.join(path)}` in its help:\n{text}"
    )
    lines = text.splitlines()
    too_wide = [line for line in lines if len(line) > 80]
    assert not too_wide, too_wide
    # An example on the line of its label fits there: no command cut in two.
    cut = [
        line
        for line, after in zip(lines, lines[1:] + [""])
        if line.lstrip().startswith("Example: ") and after.strip()
    ]
    assert not cut, cut
    # Each command's summary is whole, not cut short with "...".
    cut_short = [
        line for line in text.partition("\nCommands:\n")[2].splitlines() if line.endswith("...")
    ]
    assert not cut_short, cut_short


def test_values_are_named_by_what_they_are():
    text = help_text("submit")
    for shown in (
        "[-- COMMAND...]",
        "--gpus N",
        "--gpu-mem SIZE",
        "--env NAME=VALUE",
        "--time DURATION",
        "--after JOBID[,JOBID]",
        "--mem SIZE",
    ):
        assert shown in text, shown
    assert "Usage: gpusched show [OPTIONS] JOBID\n" in help_text("show")
    assert "Usage: gpusched cancel [OPTIONS] JOBID...\n" in help_text("cancel")


def run(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
    home = Home(REPO / "no-such-home")  # no command here may start a daemon or need one
    return subprocess.run(
        [sys.executable, "-m", "gpusched", *args],
        capture_output=True,
        text=True,
        env={**home.env, "COLUMNS": "80"},
        cwd=REPO,
        input=input,
    )


@pytest.mark.e2e
@pytest.mark.parametrize("args", [[], ["daemon"]], ids=["gpusched", "gpusched daemon"])
def test_a_group_alone_prints_its_help_and_exits_0(args):
    proc = run(*args)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith(
        f"Usage: gpusched {' '.join(args)}".rstrip() + " [OPTIONS] COMMAND"
    )
    assert "Commands:\n" in proc.stdout and len(proc.stdout.splitlines()) > 10


@pytest.mark.e2e
@pytest.mark.parametrize(
    "args", [["-h"], ["submit", "-h"], ["daemon", "start", "-h"], ["ls", "-h"], ["resubmit", "-h"]]
)
def test_dash_h_is_help_everywhere(args):
    proc = run(*args)
    assert proc.returncode == 0, proc.stderr
    command = " ".join(a for a in args if a != "-h")
    assert proc.stdout.startswith(f"Usage: gpusched {command}".rstrip() + " [OPTIONS]")


@pytest.mark.parametrize("through", ["console script", "typer"])
def test_dash_h_after_the_command_belongs_to_the_job(home, through):
    # The fast path and the full parser alike: after `--` (or the command's first word)
    # everything is the job's, `-h` too.
    args = ["submit", "--json", "--", "sh", "-c", 'echo "$@"', "sh", "-h", "--help"]
    if through == "typer":
        code = "import sys; from gpusched.cli.app import main; sys.exit(main(sys.argv[1:]))"
        proc = subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            env=home.env,
            cwd=home.path,
        )
    else:
        proc = home.run(*args)
    assert proc.returncode == 0, proc.stderr
    job_id = json.loads(proc.stdout)["id"]
    assert home.wait_state(job_id, "succeeded", "failed")["state"] == "succeeded"
    assert home.run("logs", str(job_id)).stdout == "-h --help\n"
