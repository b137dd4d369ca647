"""Slurm compatibility, proven side by side: every scenario of tests/slurmcompat.py runs against
a real one-node Slurm and against gpusched (a daemon in a temporary home, two simulated
GPUs), at once; each row a user sees must be equal, or listed in docs/slurm-compat.md as
a deliberate difference. An unlisted difference fails. Skips, with the reason, where Slurm
cannot run (tests/slurmnode.py)."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import REPO
from slurmcompat import SCENARIOS, GpuschedSide, SlurmSide, settle

COMPAT_DOC = REPO / "docs" / "slurm-compat.md"


def deliberate_rows() -> set[str]:
    """The suite rows docs/slurm-compat.md lists as deliberate differences: the
    `scenario: row` names in the first cell of its table's rows."""
    rows = set()
    for line in COMPAT_DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("|"):
            rows.update(re.findall(r"`([a-z][a-z :-]*: [^`]+)`", line.split("|")[1]))
    return rows


def test_the_doc_names_only_rows_the_suite_has():
    """A listed row no scenario has would excuse nothing: a typo, or a row renamed."""
    scenarios = set(SCENARIOS)
    for row in deliberate_rows():
        assert row.split(": ", 1)[0] in scenarios, row


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_matches_slurm(name, slurm, make_home, tmp_path):
    home = make_home("2x80GiB")
    home.start()
    sides = []
    for side_class, handle in ((SlurmSide, slurm), (GpuschedSide, home)):
        workdir = tmp_path / side_class.name
        workdir.mkdir()
        workdir.chmod(0o777)  # slurmd writes here as the job's user
        sides.append(side_class(handle, workdir))
    try:
        with ThreadPoolExecutor(2) as pool:
            slurm_seen, ours = pool.map(lambda side: settle(SCENARIOS[name], side), sides)
    finally:
        slurm.cancel_all()
    allowed = deliberate_rows()
    unlisted = {
        row: (slurm_seen.get(row), ours.get(row))
        for row in slurm_seen.keys() | ours.keys()
        if slurm_seen.get(row) != ours.get(row) and f"{name}: {row}" not in allowed
    }
    assert not unlisted, (
        f"{name}: rows that differ from Slurm (slurm, gpusched) and are not "
        f"in docs/slurm-compat.md: {unlisted}"
    )
