"""The sdist and the wheel (issue 21), built from a git checkout of this tree as pip builds
them: named gpusched-cli, every module and the man page in the wheel, what the docs point
to in the sdist, and the commit they were built from in both. .ci/package-check installs
the wheel into a fresh virtualenv and runs it; this is the quick check of the contents."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from conftest import REPO
from gpusched import __version__

pytestmark = pytest.mark.e2e

pytest.importorskip("setuptools", minversion="77")  # the `test` extra brings it
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
DIST = "gpusched_cli"
BUILD = (
    "import sys; from setuptools import build_meta as b; "
    "print(getattr(b, sys.argv[1])(sys.argv[2]))"
)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def build(source: Path, hook: str, out: Path) -> Path:
    """What pip and `python -m build` run: the PEP 517 hook of the backend, in SOURCE."""
    out.mkdir(exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-c", BUILD, hook, str(out)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> tuple[Path, str]:
    """This tree's files (tracked and new, not ignored) in a fresh git checkout: a build
    here never touches the real one."""
    if not (REPO / ".git").exists():
        pytest.skip("not run from a git checkout")
    root = tmp_path_factory.mktemp("checkout")
    listed = git(REPO, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "a release")
    return root, git(root, "rev-parse", "HEAD")


@needs_git
def test_the_wheel_holds_every_module_the_man_page_and_the_commit(checkout, tmp_path):
    root, commit = checkout
    wheel = build(root, "build_wheel", tmp_path / "dist")
    assert wheel.name == f"{DIST}-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(f"{DIST}-{__version__}.dist-info/METADATA").decode()
        entry_points = archive.read(f"{DIST}-{__version__}.dist-info/entry_points.txt").decode()
        man_page = archive.read(f"{DIST}-{__version__}.data/data/share/man/man1/gpusched.1")
        archive.extractall(tmp_path / "site")
    modules = {str(p.relative_to(root)) for p in (root / "gpusched").rglob("*.py")}
    assert modules - names == set()
    assert "Name: gpusched-cli\n" in metadata
    assert "gpusched = gpusched.cli.entry:main" in entry_points
    assert man_page == (root / "man/gpusched.1").read_bytes()
    # The unpacked wheel alone (no .git beside it) still names its commit.
    proc = subprocess.run(
        [sys.executable, "-m", "gpusched", "--version"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path / "site")},
    )
    assert proc.stdout == f"gpusched {__version__} (commit {commit[:12]})\n", proc.stderr


@needs_git
def test_the_sdist_holds_what_the_docs_and_the_wheel_need(checkout, tmp_path):
    root, commit = checkout
    sdist = build(root, "build_sdist", tmp_path / "dist")
    top = f"{DIST}-{__version__}"
    with tarfile.open(sdist) as archive:
        names = {name.partition("/")[2] for name in archive.getnames()}
        archive.extractall(tmp_path, filter="data")
    wanted = {
        "pyproject.toml",
        "setup.py",
        "MANIFEST.in",
        "README.md",
        "CHANGELOG.md",
        "gpusched.toml.example",
        "man/gpusched.1",
        "completions/gpusched.bash",
        "completions/_gpusched",
        "completions/gpusched.fish",
        "jobs/README.md",
        "jobs/train_ddp.py",
        "contrib/notify/notify-desktop.sh",
        "docs/shared-server.md",
        "tests/conftest.py",
        "gpusched/_commit.py",
    }
    assert wanted - names == set()
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    # pip building a wheel from the sdist (no .git there) keeps the commit.
    wheel = build(tmp_path / top, "build_wheel", tmp_path / "from-sdist")
    with zipfile.ZipFile(wheel) as archive:
        assert f'COMMIT = "{commit}"' in archive.read("gpusched/_commit.py").decode()
        assert f"{DIST}-{__version__}.data/data/share/man/man1/gpusched.1" in archive.namelist()
