"""Install lines name our distribution (issue 21): the package index's `gpusched` is another
project, so no document, script or message may tell anyone to install that name; the
distribution in pyproject.toml is the one the docs install."""

from __future__ import annotations

import re
import sys

import pytest

from conftest import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DISTRIBUTION = "gpusched-cli"
# An install command (pip, pip3, python -m pip, uv pip, pipx, uv tool; install or inject),
# then among its arguments (up to ;, &&, |, #, a comma or a backquote) the bare name
# `gpusched`: not a path (./gpusched), not a longer name (gpusched-cli,
# gpusched_cli-0.1.0.whl); `gpusched==0.4` and `gpusched[jobs]` count.
BAD_INSTALL = re.compile(
    r"\b(?:pip3?|pipx|uv(?: tool| pip)?)\s+(?:install|inject)\b[^\n;&|#`,]*?"
    r"(?<![\w./~-])gpusched(?![\w-])(?!\.whl|\.tar)"
)
CHECKED = (
    "*.md",
    "docs/**/*",
    "jobs/**/*",
    "contrib/**/*",
    "bench/**/*",
    ".ci/*",
    "gpusched/**/*.py",
    "man/*",
    "pyproject.toml",
    "gpusched.toml.example",
    "completions/*",
)


def checked_files() -> list:
    files = {p for pattern in CHECKED for p in REPO.glob(pattern) if p.is_file()}
    return sorted(p for p in files if "__pycache__" not in p.parts)


@pytest.mark.parametrize(
    "line",
    [
        "pip install gpusched",
        "sudo /opt/gpusched/bin/pip install gpusched  # or: ...",
        "python -m pip install -U gpusched==0.1.0",
        "pipx install gpusched",
        "pip3 install gpusched",
        "uv tool install gpusched",
        "uv pip install 'gpusched[jobs]'",
        "pipx inject gpusched ./p",
        "`pip install gpusched`.",
    ],
)
def test_the_pattern_catches_installs_of_the_other_project(line):
    assert BAD_INSTALL.search(line), line


@pytest.mark.parametrize(
    "line",
    [
        "pip install gpusched-cli",
        "sudo /opt/gpusched/bin/pip install gpusched-cli",
        "pipx install ./gpusched_cli-0.1.0-py3-none-any.whl",
        "pip install /srv/src/gpusched",
        "pipx inject gpusched-cli ./example-gpusched-policy",
        "pip install ~/gpusched",
        "uv tool install . && gpusched demo",
        "pip install -e '.[jobs]'",
    ],
)
def test_the_pattern_lets_our_installs_pass(line):
    assert not BAD_INSTALL.search(line), line


def test_no_document_installs_the_other_projects_gpusched():
    files = checked_files()
    assert REPO / "docs/shared-server.md" in files and REPO / "README.md" in files
    bad = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(
            path.read_text(encoding="utf-8", errors="replace").splitlines(), 1
        )
        if BAD_INSTALL.search(line.replace("\\-", "-"))  # roff writes a hyphen as \-
    ]
    assert not bad, f"install {DISTRIBUTION} (or a path or wheel) instead:\n" + "\n".join(bad)


def test_the_distribution_is_the_one_the_docs_install():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION
    assert project["scripts"] == {"gpusched": "gpusched.cli.entry:main"}
    readme = (REPO / "README.md").read_text()
    for line in (
        f"pipx install {DISTRIBUTION}",
        f"uv tool install {DISTRIBUTION}",
        "pipx install .",
        "uv tool install .",
    ):
        assert line in readme, line
    assert (
        f"/opt/gpusched/bin/pip install {DISTRIBUTION}"
        in (REPO / "docs/shared-server.md").read_text()
    )


# A path cited in code, tests, benchmarks or docs (`daemon/jobs/gpumemory.py`, `docs/slurm.md`,
# `CHANGELOG.md`): read from the repository, the package, tests/, bench/, docs/ or the
# citing file's folder. Written where they will exist, or placeholders of an example:
CITED = re.compile(r"(?<![\w./-])((?:[\w-]+/)+[\w-]+\.py|(?:[\w-]+/)*[\w-]+\.md)\b")
NOT_FILES = {
    "CHECKOUT/gpusched/cli/version.py",
    "PACKAGE/_commit.py",
    "gpusched/_commit.py",
    "mypolicies/cool.py",
}


def test_every_file_cited_in_code_tests_and_docs_exists():
    sources = [
        path
        for pattern in (
            "gpusched/**/*.py",
            "tests/**/*.py",
            "bench/**/*.py",
            "docs/*.md",
            "*.md",
            "tests/fixtures/**/*.md",
        )
        for path in REPO.glob(pattern)
    ]
    missing = [
        f"{path.relative_to(REPO)}:{number}: {cited}"
        for path in sources
        for number, line in enumerate(path.read_text().splitlines(), 1)
        for cited in CITED.findall(line)
        if cited not in NOT_FILES
        and not any(
            (where / cited).exists()
            for where in (
                REPO,
                REPO / "gpusched",
                REPO / "tests",
                REPO / "bench",
                REPO / "docs",
                path.parent,
            )
        )
    ]
    assert missing == []
