"""`gpusched --version` (issue 21): the version, plus the commit when the code runs from a
git checkout (a plain clone, a worktree, packed refs, a detached HEAD), read from git's
files without typer or git itself."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CONSOLE_SCRIPT, REPO
from gpusched import __version__
from gpusched.cli.version import build_commit, checkout_commit
from test_lean_imports import CONSOLE_SCRIPT as LISTING_SCRIPT

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        [
            "git",
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "-c",
            "init.defaultBranch=main",
            *args,
        ],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def version_of(pythonpath: Path, *, fast: bool = True) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(pythonpath), "PYTHONPATH": str(pythonpath)}
    if not fast:
        env["GPUSCHED_NO_FAST_PATH"] = "1"
    return subprocess.run(
        [str(CONSOLE_SCRIPT), "--version"],
        capture_output=True,
        text=True,
        env=env,
        cwd=pythonpath,
        timeout=60,
    )


@pytest.mark.e2e
@needs_git
@pytest.mark.skipif(not (REPO / ".git").exists(), reason="not run from a git checkout")
def test_version_from_this_checkout_names_its_commit():
    head = git(REPO, "rev-parse", "HEAD")
    for fast in (True, False):  # the console script's own answer, and typer's
        proc = version_of(REPO, fast=fast)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == f"gpusched {__version__} (commit {head[:12]})\n"
        assert proc.stderr == ""


@pytest.mark.e2e
def test_version_of_an_installed_copy_is_the_version_alone(tmp_path):
    # As a wheel installs it: the package, with no .git beside it.
    shutil.copytree(
        REPO / "gpusched", tmp_path / "gpusched", ignore=shutil.ignore_patterns("__pycache__")
    )
    for fast in (True, False):
        proc = version_of(tmp_path, fast=fast)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"gpusched {__version__}\n", "")


@pytest.mark.e2e
def test_version_imports_no_command_line_library(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-S", "-c", LISTING_SCRIPT, "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"gpusched {__version__}")
    loaded = {name.split(".")[0] for name in proc.stderr.split("MODULES ")[-1].split()}
    assert not {"typer", "click", "rich", "subprocess", "re"} & loaded


@pytest.mark.e2e
@needs_git
def test_commit_of_a_clone_a_worktree_packed_refs_and_a_detached_head(tmp_path):
    clone = tmp_path / "clone"
    clone.mkdir()
    git(clone, "init", "-q")
    git(clone, "commit", "-q", "--allow-empty", "-m", "one")
    first = git(clone, "rev-parse", "HEAD")
    assert checkout_commit(str(clone)) == first

    git(clone, "worktree", "add", "-q", "-b", "side", str(tmp_path / "side"))
    git(tmp_path / "side", "commit", "-q", "--allow-empty", "-m", "two")
    second = git(tmp_path / "side", "rev-parse", "HEAD")
    assert checkout_commit(str(tmp_path / "side")) == second  # `.git` is a file there

    git(clone, "pack-refs", "--all")  # the branches now live in packed-refs only
    assert not (clone / ".git/refs/heads/main").exists()
    assert checkout_commit(str(clone)) == first
    assert checkout_commit(str(tmp_path / "side")) == second

    git(clone, "checkout", "-q", "--detach", second)
    assert checkout_commit(str(clone)) == second


def test_no_commit_where_git_files_are_missing_or_strange(tmp_path):
    assert checkout_commit(str(tmp_path)) == ""  # no .git at all
    (tmp_path / ".git").write_text("gitdir: nowhere\n")
    assert checkout_commit(str(tmp_path)) == ""
    (tmp_path / ".git").unlink()
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git/HEAD").write_text("ref: refs/heads/unborn\n")  # a new repository
    assert checkout_commit(str(tmp_path)) == ""
    (tmp_path / ".git/HEAD").write_bytes(b"\xff\xfe")
    assert checkout_commit(str(tmp_path)) == ""


def test_a_builds_commit_file_is_read_as_text_and_checked(tmp_path):
    assert build_commit(str(tmp_path)) == ""  # not a build: no _commit.py
    sha = "0123456789abcdef0123456789abcdef01234567"
    (tmp_path / "_commit.py").write_text(f'"""The git commit."""\n\nCOMMIT = "{sha}"\n')
    assert build_commit(str(tmp_path)) == sha
    (tmp_path / "_commit.py").write_text('COMMIT = "not a commit"\n')
    assert build_commit(str(tmp_path)) == ""
