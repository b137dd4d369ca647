"""The tiers of the suite (tests/tiers.py): one each, and a unit test starts no process."""

from __future__ import annotations

import os
import subprocess

import pytest

from tiers import TIERS


def test_every_collected_test_is_in_exactly_one_tier(request):
    for item in request.session.items:
        tiers = [mark.name for mark in item.iter_markers() if mark.name in TIERS]
        assert len(tiers) == 1, f"{item.nodeid}: {tiers}"


def test_this_test_is_unit_by_default(request):
    assert request.node.get_closest_marker("unit")


@pytest.mark.parametrize(
    "start",
    [lambda: subprocess.run(["true"]), lambda: os.posix_spawn("/bin/true", ["true"], {})],
    ids=[
        "subprocess",
        "posix_spawn",
    ],  # not os.fork: were the guard broken, two pytests would go on
)
def test_a_unit_test_that_starts_a_process_fails_saying_how_to_mark_it(start):
    with pytest.raises(AssertionError, match=r"a unit test starts no process: mark"):
        start()


@pytest.mark.e2e
def test_a_marked_test_may_start_processes():
    assert subprocess.run(["true"]).returncode == 0
