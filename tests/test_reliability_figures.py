"""bench/reliability.py at its CI size: every figure that counts a failure reads 0.

The script drives real daemons through the console script; this test only runs it once
(`--small --json`) and checks each count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from filelock import FileLock

from conftest import CONSOLE_SCRIPT, REPO

pytestmark = pytest.mark.e2e  # the script drives real daemons

# (part, failure count): every count the script reports, in its order.
FIGURES = [
    ("submitters", "duplicates"),
    ("submitters", "acked_not_stored"),
    ("submitters", "stored_not_acked"),
    ("submitters", "refused"),
    ("kills", "exit_status_lost"),
    ("kills", "orphans"),
    ("kills", "double_leases"),
    ("crashpoints", "acked_missing"),
    ("crashpoints", "run_twice"),
    ("crashpoints", "unacked_ran"),
    ("crashpoints", "cancelled_ran"),
    *[
        ("diskfull", f"{where}_{what}")
        for where in ("state", "logs")
        for what in ("daemon_crashes", "hung_jobs", "acked_lost", "refused_ran", "reads_failed")
    ],
    ("corrupt", "started_on_damage"),
    ("corrupt", "file_changed"),
    ("corrupt", "unclear_refusal"),
    ("corrupt", "bad_row_fatal"),
    ("corrupt", "intact_refused"),
    ("malformed", "exceptions"),
    ("malformed", "no_reply"),
    ("malformed", "accepted"),
    ("malformed", "daemon_deaths"),
    ("malformed", "listing_broken"),
    ("unauthorized", "successes"),
    *[
        ("stops", what)
        for what in (
            "not_stopped_after_restart",
            "not_stopped_after_sigkill",
            "time_limit_overrun",
            "fifo_not_stopped",
            "fifo_no_reason",
            "blocked_after_fifo",
        )
    ],
    *[
        ("notify", what)
        for what in (
            "notifications_late",
            "notifications_never_sent",
            "posts_not_cut_off",
            "daemon_memory_growth",
        )
    ],
    *[
        ("requestlog", what)
        for what in ("steps_aborted", "services_frozen", "spoofed_lines_taken", "window_growth")
    ],
    ("privacy", "leaks"),
    *[
        ("quota", what)
        for what in (
            "quota_not_enforced",
            "others_refused",
            "others_stalled",
            "rss_growth",
            "disk_growth",
            "threads",
        )
    ],
]


@pytest.fixture(scope="module")
def figures(tmp_path_factory) -> dict:
    """The script's figures, made by the first pytest worker to ask and read by the others
    (each runs this module's fixtures, and the script takes minutes on a busy machine)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the workers' common base directory
    made = shared / "reliability-figures.json"
    with FileLock(f"{made}.lock"):
        if not made.exists():
            made.write_text(json.dumps(run_the_script()))
    return json.loads(made.read_text())


def run_the_script() -> dict:
    assert CONSOLE_SCRIPT.exists(), f"no {CONSOLE_SCRIPT}: pip install this checkout first"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "reliability.py"), "--small", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)["parts"]


def test_the_script_reports_every_count(figures):
    reported = {(part, key) for part, fig in figures.items() for key in fig["failures"]}
    assert reported == set(FIGURES)


@pytest.mark.parametrize(
    "part,count", [pytest.param(*figure, id=f"{figure[0]}-{figure[1]}") for figure in FIGURES]
)
def test_failure_count_is_zero(figures, part, count):
    fig = figures[part]
    if fig["skipped"]:
        pytest.skip(f"{part}: {fig['skipped']}")
    what = [note for note in fig["notes"] if note.startswith(f"{count}: ")]
    assert fig["failures"][count] == 0, what
