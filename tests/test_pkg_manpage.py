"""The gpusched(1) man page (issue 21): generated from the command line, so every command
and option of `--help` is in it; the checked-in man/gpusched.1 is in step; `gpusched man |
man -l -` renders it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest
import typer

from conftest import CONSOLE_SCRIPT, REPO
from gpusched.cli import app as cli
from gpusched.cli.completions import Node, tree
from gpusched.cli.manpage import EXIT_STATUSES
from test_help import help_text

pytestmark = pytest.mark.e2e

MAN_PAGE = REPO / "man" / "gpusched.1"
REGENERATE = ".ci/regenerate"  # or: gpusched man > man/gpusched.1


def _commands(node: Node) -> list[tuple[str, ...]]:
    return [node.path, *(p for child in node.children for p in _commands(child))]


def generated() -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "gpusched", "man"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return proc.stdout


def roff_text(page: str) -> str:
    """The page's words as a reader sees them: roff's escapes undone."""
    return re.sub(r"\\f[BIR]", "", page.replace(r"\-", "-").replace(r"\&", "")).replace(r"\e", "\\")


def test_checked_in_man_page_is_not_stale():
    assert MAN_PAGE.read_text() == generated(), f"{MAN_PAGE.name} is stale: run `{REGENERATE}`"


def test_every_command_and_option_of_help_is_in_the_man_page():
    page = roff_text(generated())
    headings = {line[len('.SS "') : -1] for line in page.splitlines() if line.startswith(".SS ")}
    for path in _commands(tree(typer.main.get_command(cli.app))):
        if path:
            assert any(h.startswith(" ".join(("gpusched", *path)) + " ") for h in headings), path
        options_part = help_text(*path).split("Options:")[-1].split("Commands:")[0]
        # The option column: names start a line of the Options section.
        names = re.findall(r"^\s{2}((?:-{1,2}[\w-]+(?:, )?)+)", options_part, re.MULTILINE)
        options = {o for group in names for o in group.split(", ")}
        assert options, path
        for option in options:
            assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", page), (path, option)


def test_the_man_page_has_exit_statuses_files_and_environment():
    page = roff_text(generated())
    for section in (
        "NAME",
        "SYNOPSIS",
        "DESCRIPTION",
        "OPTIONS",
        "COMMANDS",
        "EXIT STATUS",
        "ENVIRONMENT",
        "FILES",
        "SEE ALSO",
    ):
        assert f"\n.SH {section}\n" in page, section
    for variable in (
        "GPUSCHED_HOME",
        "GPUSCHED_SOCKET",
        "GPUSCHED_SIMULATE",
        "GPUSCHED_CONFIG",
        "CUDA_VISIBLE_DEVICES",
        "GPUSCHED_JOB_ID",
    ):
        assert f"\n.TP\n{variable}\n" in page, variable
    # README's table of exit codes and the page's list name the same statuses.
    readme = (REPO / "README.md").read_text().split("### Exit codes")[1].split("\n\n")[1]
    readme_statuses = set(re.findall(r"^\| (\S+) \|", readme, re.MULTILINE)) - {"status", "---"}
    assert readme_statuses == {status for status, _ in EXIT_STATUSES}


@pytest.mark.skipif(
    shutil.which("man") is None or shutil.which("groff") is None,
    reason="man and groff are not installed",
)
def test_gpusched_man_renders_with_man_and_without_roff_warnings(tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHONPATH": str(REPO),
        "MANWIDTH": "80",
        "MAN_KEEP_FORMATTING": "0",
    }
    proc = subprocess.run(
        f"{CONSOLE_SCRIPT} man | man -l -",
        shell=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    shown = re.sub(".\b", "", proc.stdout)  # any overstrike bold a pager would show
    assert shown.startswith("GPUSCHED(1)")
    assert "gpusched submit [OPTIONS] [-- COMMAND...]" in shown
    assert "--gpu-mem SIZE" in shown and "EXIT STATUS" in shown
    warnings = subprocess.run(
        ["groff", "-man", "-Tutf8", "-ww", "-z", str(MAN_PAGE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert warnings.stderr == "", warnings.stderr
