"""Pending jobs alike are held as one template (daemon/jobs/jobtable.py): a sweep's jobs cost the
daemon a few hundred bytes each, not a whole Job, and every job reads back exactly as it was
stored, before and after a restart."""

from __future__ import annotations

import gc
import tempfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import psutil
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core.models import Job, job_with
from gpusched.core.spec.syntax import dependency_job_ids
from gpusched.daemon.jobs import stillneeded
from gpusched.daemon.jobs.jobtable import JobTable
from inproc import Box

JOBS = 10_000
# What a pending job of a sweep may cost, held: its ids, dict entries, the queue's keys.
# Held whole, a Job is over 1 KB with its log paths.
BYTES_PER_JOB = 400
SWEEP = "[jobs]\nmax_running = 4\n"
# A pending job held whole, with its log paths and its place in the tables (about 1.1 KB).
WHOLE_JOB_BYTES = 1300


def traced_bytes(action: Callable[[], object]) -> int:
    """Python memory that action() leaves allocated (its result is kept while measured)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = action()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
        del kept
        return grown
    finally:
        tracemalloc.stop()


def sweep_file(box: Box, lines: list[str]) -> str:
    path = box.root / "sweep.txt"
    path.write_text("".join(f"{line}\n" for line in lines))
    return str(path)


def test_a_sweep_of_identical_lines_costs_a_few_hundred_bytes_a_pending_job(make_box):
    box = make_box(config=SWEEP)
    box.call("drain")
    lines = sweep_file(box, ["true"] * JOBS)
    grown = traced_bytes(lambda: box.submit_all("--gpus", "0", "--from-file", lines))
    assert box.daemon.state.pending_count() == JOBS
    assert grown / JOBS < BYTES_PER_JOB


def test_the_elements_of_a_held_array_cost_a_few_hundred_bytes_each(make_box):
    # Held: each one's pending reason names its own id (`gpusched release 12`).
    box = make_box(config=SWEEP)
    grown = traced_bytes(
        lambda: box.submit_all("--hold", "--array", f"0-{JOBS - 1}", "--", "python3", "train.py")
    )
    assert box.daemon.state.pending_count() == JOBS
    assert grown / JOBS < BYTES_PER_JOB


def test_a_sweep_of_distinct_lines_costs_no_more_than_whole_jobs(make_box):
    # Each line its own template: a template's values kept beside it for every one of them
    # made each job cost half as much again as the whole Job it stands for.
    box = make_box(config=SWEEP)
    box.call("drain")
    lines = sweep_file(box, [f"python3 train.py --seed={i}" for i in range(JOBS)])
    grown = traced_bytes(lambda: box.submit_all("--gpus", "0", "--from-file", lines))
    assert box.daemon.state.pending_count() == JOBS
    assert grown / JOBS < WHOLE_JOB_BYTES


def test_a_restart_on_a_sweep_holds_it_as_compactly(make_box):
    box = make_box(config=SWEEP)
    box.call("drain")
    box.submit_all("--gpus", "0", "--from-file", sweep_file(box, ["true"] * JOBS))
    box.stop()
    grown = traced_bytes(box.start)
    assert box.daemon.state.pending_count() == JOBS
    assert grown / JOBS < BYTES_PER_JOB


# -- every job reads back exactly --------------------------------------------------------------

# Kept in memory without a write of their own (DaemonState.remember): a restart works them
# out again, so the store may hold an older value.
REMEMBERED = ("pending_reason", "runner_pid", "runner_start_time")


def assert_same(held: Job, stored: Job, leave_out: tuple[str, ...] = ()) -> None:
    """Equal in every field, the environment too, and of the same types (1 is not 1.0)."""
    for name in Job.__slots__:
        if name in leave_out:
            continue
        mine, theirs = getattr(held, name), getattr(stored, name)
        assert (mine, type(mine)) == (theirs, type(theirs)), f"job {stored.id}: {name}"


def assert_all_read_back(box: Box) -> dict[int, Job]:
    """Every active job as the daemon reads it equals the stored one; the jobs."""
    state = box.daemon.state
    jobs = {job_id: state.jobs[job_id] for job_id in state.jobs}
    stored = state.store.many(list(jobs))
    for job_id, job in jobs.items():
        assert_same(job, stored[job_id], REMEMBERED)
    for job in [*state.pending(), *state.pending_in_order()]:
        assert_same(job, jobs[job.id])
    return jobs


def assert_held_exactly(box: Box, jobs: list[Job]) -> None:
    """Each job put in a table of its own reads back as it was, and as the table holds it."""
    table = JobTable(box.daemon.state.kinds)
    for job in jobs:
        table[job.id] = job
    for job in jobs:
        assert_same(table[job.id], job)
        assert table.holds(table[job.id]) and table.holds(job)
    assert sorted(table) == sorted(job.id for job in jobs)


def reasons(job: Job) -> list[Job]:
    """The job with pending reasons a pass or a change may give it, its id in some."""
    return [
        job_with(job, id=job.id, pending_reason=reason)
        for reason in (
            "",
            "waiting to be placed",
            f"held (`gpusched release {job.id}` lets it start)",
            f"job {job.id} waits for job {job.id + 1}",
            f"{job.id}\x00{job.id}",
        )
    ]


SUBMITS = st.lists(
    st.fixed_dictionaries(
        {
            "what": st.sampled_from(
                [
                    ("--array", "0-5"),
                    ("--array", "1,4,9"),
                    ("--array", "2-20:3"),
                    ("--from-file", "alike"),
                    ("--from-file", "varied"),
                    (),
                ]
            ),
            "hold": st.booleans(),
            "env": st.sampled_from([(), ("--env", "SEED=1"), ("--env", "SEED=2")]),
            "output": st.sampled_from(
                [(), ("-o", "%j.out"), ("-o", "out-%A_%a.log", "-e", "%x.err")]
            ),
            "name": st.sampled_from([(), ("--name", "sweep")]),
            "gpus": st.sampled_from(["0", "1"]),
            "after_first": st.booleans(),
        }
    ),
    min_size=1,
    max_size=4,
)


def submit(box: Box, spec: dict, first_id: int | None) -> list[int]:
    argv = ["--gpus", spec["gpus"], *spec["env"], *spec["output"], *spec["name"]]
    argv += ["--hold"] if spec["hold"] else []
    if spec["after_first"] and first_id is not None:
        argv += ["--dependency", f"afterok:{first_id}"]
    what = spec["what"]
    if what[:1] == ("--from-file",):
        lines = ["true"] * 4 if what[1] == "alike" else [f"echo {n}" for n in range(4)] + ["true"]
        return box.submit_all(*argv, "--from-file", sweep_file(box, lines))
    return box.submit_all(*argv, *what, "--", "python3", "train.py", "--lr", "0.1")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SUBMITS, st.integers(min_value=0, max_value=3))
def test_every_pending_job_reads_back_exactly_before_and_after_a_restart(submits, passes):
    with tempfile.TemporaryDirectory(prefix="gpusched-compact-") as root:
        box = Box(Path(root) / "home", "2x80GiB", SWEEP)
        try:
            ids: list[int] = []
            for spec in submits:
                ids += submit(box, spec, ids[0] if ids else None)
            for _ in range(passes):  # passes write pending reasons; jobs start and end
                box.step(1.0)
                for job_id in list(box.shims.alive)[:1]:
                    box.shims.exit(job_id, 0)
            before = assert_all_read_back(box)
            stored = box.daemon.state.store.many(ids)
            assert_held_exactly(box, [v for job in stored.values() for v in reasons(job)][::5])
            box.restart()
            after = assert_all_read_back(box)
            pending = [job for job in before.values() if job.state.value == "pending"]
            assert {job.id for job in pending} == set(box.daemon.state.pending_ids())
            for job in pending:
                assert_same(after[job.id], job, REMEMBERED)
        finally:
            box.close()


# -- end to end -------------------------------------------------------------------------------

# What 20,000 pending jobs of a sweep may add to the daemon's RSS: their entries, and what a
# big submit leaves with the allocator and SQLite's page cache. Held whole, they took 26 MB.
SWEEP_RSS_BYTES = 15 * 2**20


def test_the_daemon_holds_a_sweep_of_20000_pending_jobs_in_a_few_megabytes(home):
    home.write_config(SWEEP)
    pid = home.start()
    home.run("ls")
    idle = psutil.Process(pid).memory_info().rss
    ids = home.json(
        "submit", "--hold", "--gpus", "0", "--from-file", "-", input="python3 train.py\n" * 20_000
    )["ids"]
    assert psutil.Process(pid).memory_info().rss - idle < SWEEP_RSS_BYTES
    some = (ids[0], ids[9_999], ids[-1])
    shown = [home.show(job_id) for job_id in some]
    home.run("daemon", "stop")
    pid = home.start()
    assert [home.show(job_id) for job_id in some] == shown
    assert psutil.Process(pid).memory_info().rss - idle < SWEEP_RSS_BYTES


# -- what grows with the queue ---------------------------------------------------------------


def test_a_retention_sweep_reads_a_sweep_of_pending_jobs_once_not_every_turn(make_box, monkeypatch):
    # Every turn of a sweep over the finished jobs read every active job, to know which
    # finished ones they still need: 100,000 pending made each turn of the loop long.
    box = make_box(config=SWEEP + "keep_finished_count = 1\n")
    finished = []
    for _ in range(3):
        finished.append(box.submit("--gpus", "1", "--", "true"))
        box.exit(finished[-1])
    box.submit_all(
        "--hold",
        "--gpus",
        "0",
        "--dependency",
        f"afterok:{finished[0]}",
        "--from-file",
        sweep_file(box, ["true"] * JOBS),
    )
    reads = []
    monkeypatch.setattr(
        stillneeded,
        "dependency_job_ids",
        lambda deps: reads.append(deps) or dependency_job_ids(deps),
    )
    report = box.call("gc", dry_run=True)
    # Two are past the count of 1; the oldest is kept for the sweep's jobs, the others go.
    assert (report["jobs"], report["kept_for_dependents"]) == (2, 1)
    assert len(reads) <= 10  # the running jobs and the sweep's template
