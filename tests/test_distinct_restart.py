"""A queue of pending jobs that each differ (a sweep file, one command per line) is held as
compactly after a restart as while it was submitted: a template per kind of job plus each
job's own command (daemon/jobs/jobtable.py's Distinct), not a whole Job or a template per job;
every job reads back exactly as it was submitted."""

from __future__ import annotations

import gc
import sqlite3

from gpusched.core.models import Job
from inproc import Box
from test_compact_queue import BYTES_PER_JOB, SWEEP, sweep_file, traced_bytes

JOBS = 10_000
# Each line its own arguments, as a sweep file has them.
LINES = [f"python3 train.py --lr 0.{i % 7 + 1} --seed={i}" for i in range(JOBS)]
# What a Distinct entry answers for the template (all but these is the job's own).
TEMPLATE_OWN = ("id", "stdout_path", "stderr_path", "array_index", "pending_reason")


def held_bytes_per_job(box: Box, action, jobs: int = JOBS) -> float:
    """What action() leaves allocated per pending job, once the box holds `jobs` pending."""
    grown = traced_bytes(action)
    assert box.daemon.state.pending_count() == jobs
    return grown / jobs


def drained_box(make_box) -> Box:
    box = make_box(config=SWEEP)
    box.call("drain")
    return box


def test_a_restart_holds_a_sweep_of_distinct_lines_in_a_few_hundred_bytes_a_job(make_box):
    # Each line was a template of its own, as large as a Job, and its key beside it: about
    # 1.9 KB a job, 500 MB for 100,000 (with what the read left to the allocator).
    box = drained_box(make_box)
    box.submit_all("--gpus", "0", "--from-file", sweep_file(box, LINES))
    box.stop()
    assert held_bytes_per_job(box, box.start) < BYTES_PER_JOB
    assert len(box.daemon.state.kinds) <= 2  # one kind of job (and what a pass made)


def test_a_big_submit_of_distinct_lines_holds_them_in_a_few_hundred_bytes_a_job(make_box):
    # A template per line too, and the submit kept its key beside it: about 1 KB a job.
    box = drained_box(make_box)
    lines = sweep_file(box, LINES)

    def submit() -> list[int]:
        return box.submit_all("--gpus", "0", "--from-file", lines)

    assert held_bytes_per_job(box, submit) < BYTES_PER_JOB


def test_jobs_submitted_one_at_a_time_each_its_own_command_are_held_compactly(make_box):
    # Each its own submit time too (a loop of `gpusched submit` calls).
    box = drained_box(make_box)
    for line in LINES[:2000]:
        box.clock.advance(0.25)
        box.submit_all("--gpus", "0", "--", *line.split())
    box.stop()
    # Their ids, commands and times included.
    assert held_bytes_per_job(box, box.start, 2000) < BYTES_PER_JOB
    assert len(box.daemon.state.kinds) <= 2


def test_a_restart_keeps_the_jobs_it_read_out_of_the_collectors_full_scans(make_box):
    # A full collection after the restart walked all 100,000 jobs again (and the reading
    # set off many, each walking every job read so far).
    box = drained_box(make_box)
    box.submit_all("--gpus", "0", "--from-file", sweep_file(box, LINES[:5000]))
    box.stop()
    gc.unfreeze()
    try:
        box.start()
        assert gc.get_freeze_count() >= 5000 and gc.isenabled()
        box.step(1.0)  # a turn with the jobs all still there keeps them out
        assert gc.get_freeze_count() >= 5000
    finally:
        gc.unfreeze()


def assert_entries_answer_as_their_jobs(box: Box) -> int:
    """Each pending job as held (alike()) answers what its whole job does, but for the
    fields a template leaves to the job; the count of entries that are no Job (a template
    and the job's own command: daemon/jobs/jobtable.py's Distinct)."""
    state, distinct = box.daemon.state, 0
    for job_id, entry in state.pending_alike():
        job = state.jobs[job_id]
        distinct += not isinstance(entry, Job)
        for name in Job.__slots__:
            if name not in TEMPLATE_OWN:
                assert getattr(entry, name) == getattr(job, name), (job_id, name)
        assert (entry.display_name, entry.is_running) == (job.display_name, job.is_running)
    return distinct


def test_distinct_entries_answer_as_their_jobs_before_and_after_a_restart(make_box):
    box = drained_box(make_box)
    box.submit_all("--gpus", "0", "--name", "sweep", "--from-file", sweep_file(box, LINES[:40]))
    box.submit_all(
        "--gpus", "0", "--from-file", sweep_file(box, ["true", "/bin/echo a", *LINES[:5]])
    )
    assert assert_entries_answer_as_their_jobs(box) >= 40
    box.restart()
    assert assert_entries_answer_as_their_jobs(box) >= 40


def test_a_damaged_command_among_distinct_rows_is_quarantined_and_the_rest_load(make_box):
    box = drained_box(make_box)
    ids = box.submit_all("--gpus", "0", "--from-file", sweep_file(box, LINES[:50]))
    commands = {job_id: box.daemon.state.jobs[job_id].command for job_id in ids}
    box.stop()
    damage = {
        ids[10]: '["python3", 7]',
        ids[20]: "[]",
        ids[30]: "not json",
        ids[40]: '"python3"',
        ids[45]: '["a", ["b"]]',
    }
    with sqlite3.connect(box.paths.db) as db:
        for job_id, text in damage.items():
            db.execute("UPDATE jobs SET command = ? WHERE id = ?", (text, job_id))
    box.start()
    state = box.daemon.state
    assert set(state.store.damaged) == set(damage)
    assert set(state.pending_ids()) == set(ids) - set(damage)
    for job_id in state.pending_ids():
        assert state.jobs[job_id].command == commands[job_id]


# -- end to end: the real CLI and daemon ------------------------------------------------------

SHOWN = (
    "id",
    "name",
    "state",
    "command",
    "cwd",
    "dependencies",
    "array_id",
    "array_index",
    "stdout_path",
    "stderr_path",
    "held",
    "gpus",
    "priority",
    "submitted_at",
)


def test_each_distinct_sweep_line_shows_the_same_after_a_restart(home, tmp_path):
    home.write_config(SWEEP)
    home.run("drain")
    first = home.submit("--gpus", "0", "--", "true")
    sweep = tmp_path / "sweep.txt"
    sweep.write_text("".join(f"{line}\n" for line in LINES[:300]))
    work = tmp_path / "work"
    work.mkdir()
    ids = home.json(
        "submit",
        "--gpus",
        "0",
        "--env",
        "SEED_BASE=7",
        "--chdir",
        str(work),
        "--dependency",
        f"afterok:{first}",
        "--from-file",
        str(sweep),
    )["ids"]
    ids += home.json(
        "submit",
        "--gpus",
        "1",
        "--name",
        "grid",
        "--hold",
        "--array",
        "0-2",
        "--from-file",
        str(sweep),
    )["ids"][:12]
    ids += home.json("submit", "--gpus", "0", "-o", "out-%j.log", "--from-file", str(sweep))["ids"][
        :5
    ]
    some = [first, *ids[:3], ids[150], ids[299], *ids[300:312], *ids[-5:]]
    before = [home.show(job_id) for job_id in some]
    envs = [home.run("env", str(job_id)).stdout for job_id in some[1:4]]
    assert all("SEED_BASE=7" in env for env in envs)
    assert len({tuple(job["command"]) for job in before}) >= 8  # each line its own
    home.run("daemon", "stop")
    home.start()
    after = [home.show(job_id) for job_id in some]
    assert after == before
    assert [home.run("env", str(job_id)).stdout for job_id in some[1:4]] == envs
    assert all(job["state"] == "pending" for job in after)
    for job in after:
        assert set(SHOWN) <= set(job), sorted(set(SHOWN) - set(job))
