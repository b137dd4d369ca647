"""The suite's four tiers, as pytest markers: `pytest -m "unit or inproc"` is the quick one.

- unit: pure code, no process started (checked: starting one fails the test);
- inproc: the daemon's real loop in this process (tests/inproc.py's `box`), real job processes;
- e2e: real daemons and jobs, driven through the CLI as users do (`home`, `make_home`);
- system: root, real users, Slurm, podman or HAProxy.

A test's tier is the marker it or its module carries, else what its fixtures say: a test
that starts processes without saying so is caught as a failing unit test.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator

import pytest

TIERS = ("unit", "inproc", "e2e", "system")
SYSTEM_FIXTURES = {"users", "make_system", "system", "slurm"}
E2E_FIXTURES = {"home", "make_home"}
INPROC_FIXTURES = {"box", "make_box"}
TIER = pytest.StashKey[str]()  # each test's tier, once collected


def pytest_configure(config: pytest.Config) -> None:
    for tier, what in (
        ("unit", "pure code, starts no process"),
        ("inproc", "the daemon's loop in the test's process"),
        ("e2e", "real daemons and jobs through the CLI"),
        ("system", "root, real users, Slurm, podman or HAProxy"),
    ):
        config.addinivalue_line("markers", f"{tier}: {what} (tests/tiers.py)")


def tier_of(item: pytest.Item) -> str:
    marked = [mark.name for mark in item.iter_markers() if mark.name in TIERS]
    if marked:
        return marked[0]  # the closest: a test's own marker over its module's
    fixtures = set(getattr(item, "fixturenames", ()))
    if fixtures & SYSTEM_FIXTURES:
        return "system"
    if fixtures & E2E_FIXTURES:
        return "e2e"
    if fixtures & INPROC_FIXTURES:
        return "inproc"
    return "unit"


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by these markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tiers = [tier_of(item) for item in items]
    # One tier each, so that `-m unit` and `-m e2e` never both select a test of a module
    # marked e2e whose own marker says unit: the tier markers of modules and classes go.
    for item in items:
        for node in item.listchain():
            node.own_markers = [m for m in node.own_markers if m.name not in TIERS]
    for item, tier in zip(items, tiers):
        item.add_marker(tier)
        item.stash[TIER] = tier


def _refuse(*args: object, **kwargs: object) -> None:
    raise AssertionError(
        "a unit test starts no process: mark the test or its module pytest.mark.e2e "
        "(or inproc, system; see tests/tiers.py)"
    )


SPAWNERS = [(subprocess.Popen, "__init__"), (os, "fork"), (os, "posix_spawn"), (os, "posix_spawnp")]


@contextlib.contextmanager
def _no_process_if_unit(item: pytest.Item) -> Iterator[None]:
    """Around a unit test's setup (its module's fixtures too) and its call."""
    if item.stash.get(TIER, "") != "unit":
        yield
        return
    saved = [(owner, name, getattr(owner, name)) for owner, name in SPAWNERS]
    for owner, name, _ in saved:
        setattr(owner, name, _refuse)
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _no_process_if_unit(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _no_process_if_unit(item):
        return (yield)
