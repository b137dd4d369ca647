"""The fast path of ls, show, gpus, wait, cancel, hold, release and logs (cli/fastcmds.py):
the one parser (client/cmdline.py) reads every command line from the commands' tables as
the typer command does, the fast path imports neither typer nor rich, and the real CLI
answers the same on both paths."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.cli import app as cli
from gpusched.cli import fastcmds, jobviews
from gpusched.cli.cmdoptions import FAST_COMMANDS

REPO = Path(__file__).resolve().parent.parent
VIEWS = {"ls": "list_jobs"}  # jobviews' function for a command, where the name differs


@pytest.fixture(scope="module")
def typer_parse():
    """(command, argv) -> the keyword arguments the typer command hands jobviews, or None
    when it refuses the command line (nothing is asked of any daemon)."""
    captured: list[dict] = []
    patch = pytest.MonkeyPatch()
    for command in FAST_COMMANDS:
        name = VIEWS.get(command, command)
        real = getattr(jobviews, name)

        def capture(*args, _real=real, **kwargs):
            captured.append(inspect.signature(_real).bind(*args, **kwargs).arguments)
            return 0

        patch.setattr(jobviews, name, capture)
    click_command = typer.main.get_command(cli.app)

    def parse(command: str, argv: list[str]) -> dict | None:
        captured.clear()
        try:
            click_command.main(args=[command, *argv], prog_name="gpusched", standalone_mode=False)
        except (typer.Exit, SystemExit):  # --help
            return None
        except typer.TyperException:  # a usage error (click's, as typer names it)
            return None
        assert len(captured) == 1, f"typer did not run {command} for {argv}"
        return captured[0]

    yield parse
    patch.undo()


def assert_same(command: str, argv: list[str], typer_parse) -> dict | None:
    """The fast parser reads ARGV as typer does, or hands it over (None)."""
    fast = fastcmds.parse(command, argv)
    if fast is not None:
        assert fast == typer_parse(command, argv), (command, argv)
    return fast


TABLE = [
    ("ls", []),
    ("ls", ["--all"]),
    ("ls", ["-a", "-r"]),
    ("ls", ["--json"]),
    ("ls", ["--user", "root", "--me"]),
    ("ls", ["-u", "root,daemon"]),
    ("ls", ["--state", "pending", "-t", "running"]),
    ("ls", ["--state=PD"]),
    ("ls", ["--name", "sweep-*"]),
    ("ls", ["-n", ""]),
    ("ls", ["--name="]),
    ("ls", ["--format", "jobid,state", "--noheader"]),
    ("ls", ["-O", "jobid"]),
    ("ls", ["--all", "--"]),
    ("ls", ["--user", "--me"]),
    ("show", ["12"]),
    ("show", ["12_3", "--json"]),
    ("show", ["--json", "12"]),
    ("show", ["--", "12"]),
    ("show", ["x"]),
    ("show", ["-"]),
    ("gpus", []),
    ("gpus", ["--json"]),
    ("gpus", ["--query", "index,name"]),
    ("gpus", ["--query=index", "--format", "csv,noheader"]),
    ("gpus", ["--format", "json"]),
    ("wait", ["1"]),
    ("wait", ["1", "2_3", "4"]),
    ("wait", ["--", "1"]),
    ("cancel", ["1", "2"]),
    ("hold", ["3"]),
    ("release", ["3", "4"]),
    ("logs", ["5"]),
    ("logs", ["-f", "5"]),
    ("logs", ["5", "--stderr", "--follow"]),
]


@pytest.mark.parametrize("command, argv", TABLE, ids=[f"{c} {' '.join(a)}" for c, a in TABLE])
def test_both_parsers_agree(command, argv, typer_parse):
    fast = assert_same(command, argv, typer_parse)
    assert fast is not None, f"the fast path gave up on {command} {argv}"


@pytest.mark.parametrize(
    "command, argv",
    [
        ("ls", ["--help"]),
        ("ls", ["-h"]),
        ("ls", ["-ar"]),
        ("ls", ["--al"]),
        ("ls", ["--all=1"]),
        ("ls", ["--user"]),
        ("ls", ["12"]),
        ("ls", ["-uroot"]),
        ("show", []),
        ("show", ["1", "2"]),
        ("show", ["-1"]),
        ("cancel", []),
        ("cancel", ["-3"]),
        ("wait", ["--json", "1"]),
        ("logs", ["-fx", "1"]),
        ("gpus", ["--query"]),
        ("gpus", ["x"]),
    ],
)
def test_the_fast_path_hands_over_what_it_does_not_read_exactly(command, argv):
    assert fastcmds.parse(command, argv) is None


def tokens(command: str) -> st.SearchStrategy[str]:
    _, rows = FAST_COMMANDS[command]
    flags = [flag for row in rows for flag in row[1]]
    words = st.sampled_from(
        ["1", "12_3", "x", "", "-", "--", "-1", "root", "a,b", "-h", "--bogus", "-ar", "csv"]
    )
    inline = st.builds(lambda f, v: f"{f}={v}", st.sampled_from(flags or ["--x"]), words)
    return st.one_of(st.sampled_from(flags or ["--x"]), words, inline)


@pytest.mark.parametrize("command", sorted(FAST_COMMANDS))
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_command_line_reads_the_same_on_both_paths(command, data, typer_parse):
    argv = data.draw(st.lists(tokens(command), max_size=6))
    assert_same(command, argv, typer_parse)


def imported_after_start(*args: str, env: dict[str, str]) -> set[str]:
    """The modules `gpusched ARGS` imports itself (after the interpreter's site)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gpusched", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    lines = [
        line.rsplit("|", 1)[-1]
        for line in proc.stderr.splitlines()
        if line.startswith("import time:")
    ]
    after_site = lines[next(i for i, name in enumerate(lines) if name.strip() == "site") + 1 :]
    return {name.strip().split(".")[0] for name in after_site}


def test_the_fast_path_imports_nothing_heavy(home):
    home.start()
    job = home.submit("--", "true")
    home.wait_state(job, "succeeded")
    env = {**home.env, "COLUMNS": "100"}
    heavy = {
        "typer",
        "click",
        "rich",
        "typing",
        "dataclasses",
        "pathlib",
        "inspect",
        # each costs more than a command's budget (issue 15): see test_lean_imports.py
        "re",
        "enum",
        "json",
        "socket",
        "selectors",
        "collections",
        "functools",
        "signal",
    }
    for args in (
        ["ls"],
        ["ls", "--all", "--format", "jobid"],
        ["show", str(job)],
        ["gpus"],
        ["wait", str(job)],
        ["logs", str(job)],
        ["cancel", str(job)],
    ):
        loaded = imported_after_start(*args, env=env)
        assert "gpusched" in loaded, args
        assert not heavy & loaded, (args, heavy & loaded)
    assert "typer" in imported_after_start("ls", env={**env, "GPUSCHED_NO_FAST_PATH": "1"})


def both_paths(home, *args: str, env: dict[str, str] | None = None, same=lambda out: out) -> tuple:
    """(stdout, stderr, exit status) of `gpusched ARGS` on the fast path, which must be
    the typer path's (both seen through `same`)."""
    fast = home.run(*args, check=False, env=env)
    full = home.run(*args, check=False, env={**(env or {}), "GPUSCHED_NO_FAST_PATH": "1"})
    assert (same(fast.stdout), fast.stderr, fast.returncode) == (
        same(full.stdout),
        full.stderr,
        full.returncode,
    ), args
    return fast.stdout, fast.stderr, fast.returncode


def timeless(listing: str) -> str:
    """`ls` with its durations blanked: a pending job's grows between the two runs."""
    return re.sub(r" +", " ", re.sub(r"\b\d+[smhd](\d\d[smh])?\b", "T", listing))


def hostless(listing: str) -> str:
    """`gpus` without its host line, whose CPU and memory use changes between the runs."""
    return re.sub(r"(?m)^host: .*$", "host", listing)


def test_the_real_cli_answers_the_same_on_both_paths(home):
    home.start()
    ended = home.submit("--name", "ended", "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    home.wait_state(ended, "failed")
    cancelled = home.submit("--hold", "--", "true")
    home.run("cancel", str(cancelled))
    blocker = home.submit("--hold", "--name", "blocker", "--", "true")
    waiting = home.submit("--after", str(blocker), "--name", "waiting", "--", "true")
    home.run("submit", "--array", "0-3", "--hold", "--name", "sweep", "--", "true")
    for args in (["ls"], ["ls", "--all", "-r"], ["ls", "--me"], ["ls", "--state", "PD"]):
        assert "waiting" in both_paths(home, *args, same=timeless)[0]
    ended_only = ["ls", "--state", "failed,cancelled"]  # their times stand still
    same = [
        ended_only,
        ["ls", "--json", *ended_only[1:]],
        ["ls", "--all", "--format", "jobid,name,state,exitcode", "--noheader"],
        ["ls", "--name", "nomatch"],
        ["ls", "--all", "--name", "x"],
        ["show", str(ended)],
        ["show", str(ended), "--json"],
        ["gpus", "--query", "index,name,memory.total"],
        ["gpus", "--format", "csv"],
        ["wait", str(ended)],
        ["wait", str(cancelled), str(ended)],
        ["logs", str(ended)],
        ["logs", "--stderr", str(ended)],
        ["cancel", str(cancelled)],
        ["hold", str(waiting)],
        ["hold", str(waiting)],
        ["release", str(waiting)],
        ["release", str(ended)],
        ["hold", str(ended), str(waiting)],
        # errors: the daemon's, the checks', and the parser's (which typer reads for both)
        ["show", "999"],
        ["show", "x"],
        ["cancel", "0"],
        ["ls", "--state", "bogus"],
        ["ls", "--user", "no-such-user-here"],
        ["ls", "--json", "--format", "jobid"],
        ["ls", "--bogus"],
        ["ls", "-h"],
        ["show"],
        ["cancel", "-1"],
        ["gpus", "--query", "x"],
    ]
    for args in same:
        both_paths(home, *args)
    out, _, status = both_paths(home, "wait", str(ended))
    assert status == 3 and out == ""
    assert both_paths(home, "logs", str(ended))[0] == "out\n"
    # In colour (FORCE_COLOR), narrow enough to cut columns, on a dumb terminal.
    for env in ({"FORCE_COLOR": "1", "NO_COLOR": ""}, {"COLUMNS": "40"}, {"TERM": "dumb"}):
        both_paths(home, *ended_only, env=env)
        assert "host" in both_paths(home, "gpus", env=env, same=hostless)[0]
    coloured = both_paths(home, *ended_only, env={"FORCE_COLOR": "1", "NO_COLOR": ""})[0]
    assert coloured.startswith("\x1b[1mID\x1b[0m") and "\x1b[31mfailed (3)" in coloured
