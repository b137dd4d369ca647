"""`gpusched --version`: the version, and the git commit when the code runs from a checkout
or was built from one.

The console script answers `--version` from here before typer is imported, so this module
imports only os and reads git's files itself: spawning `git` would cost tens of ms and
needs git installed. An installed wheel has no .git beside its package; setup.py, which
loads this file alone (hence no imports of ours at the top), records the commit in the
build instead.
"""

from __future__ import annotations

import os

_SHORT_SHA_CHARS = 12


def version_line() -> str:
    """`gpusched 0.1.0`, or `gpusched 0.1.0 (commit 6149a84b1c2d)` from a checkout or
    from a build of one."""
    from gpusched import __version__  # noqa: PLC0415 - setup.py loads this file alone

    # this file is CHECKOUT/gpusched/cli/version.py
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    commit = checkout_commit(os.path.dirname(package)) or build_commit(package)
    return f"gpusched {__version__}" + (f" (commit {commit[:_SHORT_SHA_CHARS]})" if commit else "")


def build_commit(package: str) -> str:
    """The commit a wheel or sdist was built from: setup.py writes PACKAGE/_commit.py
    (`COMMIT = "<sha>"`), read here as text, as no layer of the package imports it."""
    try:
        text = _read(os.path.join(package, "_commit.py"))
    except (OSError, UnicodeDecodeError):  # built from no checkout, or run in place
        return ""
    sha = text.rpartition("COMMIT = ")[2].strip().strip('"')
    return sha if _is_sha(sha) else ""


def checkout_commit(checkout: str) -> str:
    """The commit HEAD names in the git checkout at CHECKOUT, or '' (no checkout, or
    files we cannot read: a version line is no place for an error)."""
    try:
        git_dir = _git_dir(os.path.join(checkout, ".git"))
        if not git_dir:
            return ""
        head = _read(os.path.join(git_dir, "HEAD"))
        if not head.startswith("ref:"):
            return head if _is_sha(head) else ""  # a detached HEAD names the commit itself
        return _resolve_ref(git_dir, head[len("ref:") :].strip())
    except (OSError, UnicodeDecodeError):
        return ""


def _git_dir(dot_git: str) -> str:
    """The git directory: .git itself, or where a worktree's `.git` file points."""
    if os.path.isdir(dot_git):
        return dot_git
    if not os.path.isfile(dot_git):
        return ""
    line = _read(dot_git)
    if not line.startswith("gitdir:"):
        return ""
    return os.path.join(os.path.dirname(dot_git), line[len("gitdir:") :].strip())


def _resolve_ref(git_dir: str, ref: str) -> str:
    """A branch's commit: a loose ref file, else packed-refs; a worktree keeps both in the
    common directory that its `commondir` file names."""
    common = git_dir
    if os.path.isfile(os.path.join(git_dir, "commondir")):
        common = os.path.join(git_dir, _read(os.path.join(git_dir, "commondir")))
    for directory in dict.fromkeys((git_dir, common)):
        path = os.path.join(directory, ref)
        if os.path.isfile(path):
            sha = _read(path)
            return sha if _is_sha(sha) else ""
    packed = os.path.join(common, "packed-refs")
    if os.path.isfile(packed):
        with open(packed, encoding="utf-8") as lines:
            for line in lines:
                sha, _, name = line.strip().partition(" ")
                if name == ref and _is_sha(sha):
                    return sha
    return ""


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as file:
        return file.read(4096).strip()


def _is_sha(text: str) -> bool:
    return len(text) in (40, 64) and all(c in "0123456789abcdef" for c in text)
