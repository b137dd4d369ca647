"""The fast `submit` parser and the typer command must read every command line the same way."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpusched.cli import app as cli
from gpusched.cli.commands import submit_cmds
from gpusched.client.submit import fastsubmit
from gpusched.client.submit.options import RESUBMIT, SUBMIT, SubmitOptions
from gpusched.core.errors import UsageError

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def typer_parse(monkeypatch):
    """argv -> the SubmitOptions the typer `submit` command builds (nothing is submitted)."""
    captured: list[SubmitOptions] = []

    def capture(opts: SubmitOptions) -> int:
        captured.append(opts)
        return 0

    monkeypatch.setattr(submit_cmds, "submit_and_report", capture)
    command = typer.main.get_command(cli.app)

    def parse(argv: list[str]) -> SubmitOptions:
        captured.clear()
        status = command.main(args=["submit", *argv], prog_name="gpusched", standalone_mode=False)
        assert status in (0, None)
        assert len(captured) == 1, f"typer did not run submit for {argv}"
        return captured[0]

    return parse


def assert_same(argv: list[str], typer_parse) -> SubmitOptions:
    fast = fastsubmit.parse(argv)
    assert fast is not None, f"the fast path gave up on {argv}"
    full = typer_parse(argv)

    # Compare field by field as plain values: a tuple where the other has a list is the
    # same command line, but a different value is a real disagreement.
    def as_plain(o):
        return {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in o.as_dict().items()}

    assert as_plain(fast) == as_plain(full), argv
    return fast


TABLE = [
    ["--", "python", "train.py"],
    ["python", "train.py", "--lr", "3"],
    ["--gpus", "2", "--", "python", "train.py", "--gpus", "8"],
    ["-G", "1", "--gpu-mem", "20G", "--", "python", "-c", "print(1)"],
    ["--gpus=3", "--gpu-mem=12GiB", "--", "x"],
    ["--name", "sweep", "-J", "last-wins", "--", "x"],
    ["--priority", "-5", "--", "x"],
    ["--priority=7", "x"],
    ["--gpus", "-1", "--", "x"],
    ["--gpus", "0", "--", "x"],
    ["--gpus", "+2", "--", "x"],
    ["--cwd", "/tmp", "--", "pwd"],
    ["--env", "A=1", "--env", "B=2=3", "--env=C=", "--", "env"],
    ["-J", "a", "-D", "/tmp", "-H", "-n", "1", "-N", "1", "--", "x"],  # sbatch's letters
    ["--ntasks=1", "--nodes=1-1", "--", "x"],
    ["--from-file", "jobs.txt"],
    ["-f", "-"],
    ["--from-file=-", "--gpus", "1"],
    ["--wait", "--json", "--", "true"],
    ["-W", "--", "sh", "-c", "exit 3"],
    ["--", "--gpus", "1"],
    ["--"],
    [],
    ["--gpus", "1"],
    ["-", "x"],
    ["--json", "--", ""],
    ["--name", "", "--", "x"],
    ["--gpu-mem", "12XB", "--", "x"],  # a bad size is the checker's business, not the parser's
    ["--gpus", "a100:2", "--", "x"],  # Slurm's TYPE:N
    ["--gpus", "one", "--", "x"],  # the checker refuses it, not the parser
    ["--job-name", "a", "--chdir", "/tmp", "--cpus-per-task", "2", "--", "x"],
    ["--kill-on-invalid-dep=yes", "--", "x"],
    ["--kill-on-invalid-dep=NO", "x"],
    ["--kill-on-invalid-dep", "--kill-on-invalid-dep=no", "--", "x"],  # the last one wins
    ["--kill-on-invalid-dep=no", "--kill-on-invalid-dep", "x"],
    ["--name", "--kill-on-invalid-dep=no", "--kill-on-invalid-dep", "x"],  # a value, not an option
    ["--kill-on-invalid-dep", "--", "x", "--kill-on-invalid-dep=no"],  # the command's own
    ["--preemptible", "--preempt-grace", "2m", "--", "x"],
    ["--no-preemptible", "--preempt-grace=30", "x"],
    ["--preemptible", "--no-preemptible", "--", "x"],  # the checker refuses the pair
    ["-o", "logs/%x-%j.out", "-e", "e-%A_%4a.err", "--open-mode=append", "--", "x"],
    ["--output=o.txt", "--error", "-", "--open-mode", "truncate", "x"],
]


@pytest.mark.parametrize("argv", TABLE, ids=[" ".join(a) or "(empty)" for a in TABLE])
def test_both_parsers_agree(argv, typer_parse):
    assert_same(argv, typer_parse)


def test_parsed_values():
    opts = fastsubmit.parse(
        [
            "-G",
            "2",
            "--gpu-mem",
            "20G",
            "-J",
            "a",
            "--priority",
            "-3",
            "--cwd",
            "/tmp",
            "--env",
            "A=1",
            "--env",
            "B=2",
            "-W",
            "--json",
            "--",
            "python",
            "t.py",
            "--json",
        ]
    )
    assert opts == SubmitOptions(
        command=["python", "t.py", "--json"],
        gpus="2",
        gpu_mem="20G",
        name="a",
        priority=-3,
        cwd="/tmp",
        env=["A=1", "B=2"],
        wait=True,
        json=True,
    )


SAMPLES = {"gpu_mem": "20G", "cwd": "/tmp", "from_file": "jobs.txt", "env": "K=V", "gpus": "a100:2"}


def sample_value(field: str, kind: str) -> str:
    return "3" if kind == "int" else SAMPLES.get(field, "abc")


@pytest.mark.parametrize("option", sorted(fastsubmit.OPTIONS))
def test_every_fast_option_means_the_same_to_typer(option, typer_parse):
    field, kind = fastsubmit.OPTIONS[option]
    argv = [option] if kind in ("flag", "yesno") else [option, sample_value(field, kind)]
    opts = assert_same(argv + ["--", "true"], typer_parse)
    assert getattr(opts, field) != getattr(SubmitOptions(), field)  # it did set something
    if kind == "yesno":
        for value in ("yes", "no"):
            assert_same([f"{option}={value}", "--", "true"], typer_parse)
    elif option.startswith("--") and kind != "flag":
        assert_same([f"{option}={sample_value(field, kind)}", "--", "true"], typer_parse)


def _typer_rows(command_name: str) -> list[tuple]:
    """The typer command's options as rows of the options table (field, flags, kind,
    default, help), in the order its help lists them. A yes/no option is a typer flag
    (SubmitCommand folds Slurm's =yes and =no into it)."""
    command = typer.main.get_command(cli.app).commands[command_name]
    rows = []
    for p in command.params:
        if p.param_type_name != "option" or p.name == "help":
            continue
        value_type = p.type_descriptor.annotation  # str for an Optional[str] too
        kind = (
            "list" if p.multiple else "int" if value_type is int else "flag" if p.is_flag else "str"
        )
        default = list(p.default) if p.multiple else p.default
        rows.append((p.name, tuple(p.opts + p.secondary_opts), kind, default, p.help))
    return rows


@pytest.mark.parametrize("command, table", [("submit", SUBMIT), ("resubmit", RESUBMIT)])
def test_the_typer_commands_have_exactly_the_tables_options(command, table):
    as_typer_reads = [
        (field, flags, "flag" if kind == "yesno" else kind, default, help_text)
        for field, flags, kind, default, help_text in table
    ]
    assert _typer_rows(command) == as_typer_reads


def test_resubmit_takes_a_subset_of_submits_options():
    submit = {field: flags for field, flags, _, _, _ in SUBMIT}
    for field, flags, kind, default, _ in RESUBMIT:
        assert set(flags) <= set(submit[field]), field
        assert default is (False if kind == "flag" else None), field  # "not given"


@pytest.mark.e2e
def test_the_fast_path_imports_nothing_heavy():
    # Every submit pays for what the fast path imports: no typer or rich, and none of the
    # standard library's slow ones. -S: without site, which imports some of them itself.
    code = (
        "import sys; from gpusched.client.submit import fastsubmit; "
        "from gpusched.client import connection; print(' '.join(sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    ).stdout.split()
    assert {"gpusched.client.submit.options", "gpusched.client.cmdline"} <= set(loaded)
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
    assert not heavy & {name.split(".")[0] for name in loaded}


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--gpus", "1", "--help"],
        ["-h"],
        ["--gpuz", "1", "--", "x"],
        ["--verbose"],
        ["--priority", "one", "--", "x"],
        ["--cpus", "1.5", "--", "x"],
        ["--priority", "", "--", "x"],
        ["--gpus"],
        ["--gpu-mem"],
        ["--name"],
        ["-J"],
        ["--json=yes", "--", "x"],
        ["-WG", "1", "x"],
        ["-G1", "--", "x"],
        ["--kill-on-invalid-dep=maybe", "--", "x"],
        ["--kill-on-invalid-dep="],
    ],
)
def test_fast_path_hands_over_what_it_does_not_know(argv):
    assert fastsubmit.parse(argv) is None


@pytest.mark.parametrize(
    "argv",
    [
        ["--priority", "one", "--", "x"],
        ["--gpuz", "1", "--", "x"],
        ["--gpus"],
        ["--kill-on-invalid-dep=maybe", "--", "x"],
    ],
)
def test_what_the_fast_path_hands_over_is_a_usage_error_for_typer(argv, typer_parse, capsys):
    # The full parser then says what is wrong, with exit status 2.
    assert cli.main(["submit", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and err.count("\n") == 1


# Command lines built from the fast path's own options, values that look like options
# included, then a command: both parsers must agree on every one.
def _option_args(option: str) -> st.SearchStrategy[list[str]]:
    _field, kind = fastsubmit.OPTIONS[option]
    if kind == "flag":
        return st.just([option])
    if kind == "yesno":
        return st.sampled_from([[option], [f"{option}=yes"], [f"{option}=no"], [f"{option}=No"]])
    if kind == "int":
        values = st.integers(-(10**6), 10**6).map(str)
    else:
        values = st.sampled_from(["x", "20G", "A=1", "-", "--gpus", "a b", "", "=", "é"])
    return values.map(lambda v: [option, v]) | (
        values.map(lambda v: [f"{option}={v}"]) if option.startswith("--") else st.nothing()
    )


command_lines = st.tuples(
    st.lists(st.sampled_from(sorted(fastsubmit.OPTIONS)).flatmap(_option_args), max_size=6),
    st.booleans(),
    st.lists(
        st.sampled_from(["python", "train.py", "--lr", "-x", "1", "--", "--gpus"]),
        min_size=1,
        max_size=4,
    ),
).map(lambda t: [a for opt in t[0] for a in opt] + (["--"] if t[1] else []) + t[2])


# The fixture only swaps in a capturing function; every example starts from a clean capture.
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(command_lines)
def test_generated_command_lines_agree(typer_parse, argv):
    # A command line the fast path hands over has nothing to disagree about; assume()
    # (not return) so that a fast path that gave up on everything fails the health check.
    try:
        fast = fastsubmit.parse(argv)
    except UsageError as refused:  # an sbatch option gpusched refuses, or stray words
        with pytest.raises(UsageError, match=re.escape(refused.message)):
            typer_parse(argv)  # refused by the full parser too, in the same words
        return
    assume(fast is not None)
    assert_same(argv, typer_parse)
