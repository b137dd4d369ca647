"""A bad row is quarantined, not fatal; `gpusched doctor` explains a home and `--repair`
saves what can be saved into a new queue, ids carrying on above the old ones."""

from __future__ import annotations

import json
from pathlib import Path

from queue_damage import bad_page, fingerprint, missing, place, sql, wal_frame_damaged


def spoil_rows(db: Path) -> None:
    """Jobs 4 and 5 pending and ready to run, but their rows are wrong; jobs 2 and 3 too.
    (The crashed base: jobs 1-3 ran, 4-7 are held.)"""
    sql(
        db,
        "UPDATE jobs SET held = 0 WHERE id IN (4, 5)",
        "UPDATE jobs SET env = '{not json' WHERE id = 4",  # an active row
        "UPDATE jobs SET gpus = 'many' WHERE id = 5",
        "UPDATE jobs SET state = 'bogus' WHERE id = 3",
        # A NULL where a value must be: the constraint is gone from a hand-edited schema.
        "PRAGMA writable_schema = 1",
        "UPDATE sqlite_master SET sql = replace(sql, 'command TEXT NOT NULL', 'command TEXT') "
        "WHERE name = 'jobs'",
    )
    sql(db, "UPDATE jobs SET command = NULL WHERE id = 2")


def test_bad_rows_are_quarantined_and_the_daemon_runs_the_others(bases, make_home):
    home = make_home("2x80GiB")
    state = place(bases["crashed"], home)
    spoil_rows(state / "queue.db")
    # The daemon starts, lists what it can, and runs new work.
    listed = {j["id"]: j["state"] for j in home.jobs()}
    assert listed == {1: "succeeded", 6: "pending", 7: "pending"}
    new = home.submit("--", "true")
    assert new == 8  # above every id, damaged ones included
    home.wait_state(new, "succeeded")
    # The damaged pending jobs were never started.
    assert not (state / "jobs" / "4.run.jsonl").exists()
    assert not (state / "jobs" / "5.run.jsonl").exists()
    status = json.loads(home.run("daemon", "status", "--json").stdout)
    assert {d["id"] for d in status["damaged_jobs"]} == {2, 3, 4, 5}
    text = home.run("daemon", "status").stdout
    assert (
        "damaged jobs: 4 skipped and never run" in text and "job 4: env is not valid JSON" in text
    )
    shown = home.run("show", "3", check=False)
    assert shown.returncode == 1 and shown.stderr.count("\n") == 1
    assert "job 3 is damaged in the queue (state 'bogus' is not a job state)" in shown.stderr
    log = (state / "daemon.log").read_text()
    assert "job 5 in" in log and "gpus holds 'many'" in log
    # ls --all and show of a good job keep working.
    assert home.show(1)["state"] == "succeeded"
    assert home.run("ls", "--all").returncode == 0


def test_doctor_names_each_damaged_row_and_repair_saves_the_rest(bases, make_home):
    home = make_home("2x80GiB")
    state = place(bases["crashed"], home)
    spoil_rows(state / "queue.db")
    proc = home.run("doctor", check=False)
    assert proc.returncode == 1, proc.stdout
    for words in (
        "job 2 is damaged (command holds None",
        "job 3 is damaged (state 'bogus'",
        "job 4 is damaged (env is not valid JSON",
        "job 5 is damaged (gpus holds 'many'",
    ):
        assert words in proc.stdout, proc.stdout
    before = fingerprint(state)
    repaired = home.run("doctor", "--repair")
    assert "saved 3 job(s) (ids 1, 6, 7)" in repaired.stdout
    assert "new jobs get ids from 8" in repaired.stdout
    assert "could not save job 4: env is not valid JSON" in repaired.stdout
    kept = [p for p in state.iterdir() if p.name.startswith("queue.db.damaged-")]
    assert len(kept) == 1 and fingerprint_of(kept[0]) == before[""]
    assert json.loads(home.run("doctor", "--json").stdout)["healthy"] is True
    assert [j["id"] for j in home.jobs()] == [1, 6, 7]
    assert home.submit("--", "true") == 8


def test_repair_keeps_the_gpu_reservations(bases, make_home):
    home = make_home("2x80GiB")
    state = place(bases["crashed"], home)
    spoil_rows(state / "queue.db")
    sql(
        state / "queue.db",
        "INSERT INTO reservations VALUES "
        "('demo', '[1]', '[\"alice\"]', 4000000000.0, 4000003600.0, 'root', 1.0)",
    )
    assert "saved 3 job(s)" in home.run("doctor", "--repair").stdout
    (kept,) = json.loads(home.run("reserve", "ls", "--json").stdout)
    assert (kept["name"], kept["gpus"], kept["users"]) == ("demo", [1], ["alice"])


def fingerprint_of(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_repair_of_a_damaged_wal_keeps_what_sqlite_can_read(bases, make_home):
    home = make_home("2x80GiB")
    state = place(bases["crashed"], home)
    wal_frame_damaged(state)
    out = home.run("doctor", "--repair").stdout
    assert "its -wal could not be trusted" in out and "new jobs get ids from 8" in out
    # Jobs 5-7 were acknowledged, but only the damaged log held them: named, not reused.
    for job_id in (5, 6, 7):
        assert f"could not save job {job_id}: it was only in the damaged part of the -wal" in out
    (kept,) = [p for p in state.glob("queue.db.damaged-*") if not p.name.endswith(("wal", "shm"))]
    assert {p.name.replace(kept.name, "") for p in state.glob(kept.name + "*")} == {
        "",
        "-wal",
        "-shm",
    }  # the old file kept whole, with its sidecars
    assert [j["id"] for j in home.jobs()] == [1, 2, 3, 4]
    assert home.submit("--", "true") == 8


def test_repair_of_a_missing_queue_starts_ids_above_the_jobs_files(bases, make_home):
    home = make_home("2x80GiB")
    state = place(bases["clean"], home)
    missing(state)
    out = home.run("doctor", "--repair").stdout
    assert "missing or empty beside earlier jobs" in out and "saved 0 job(s)" in out
    assert home.submit("--", "true") == 4  # the files go up to job 3


def test_repair_of_a_corrupt_page_reads_row_by_row(bases, make_home):
    home = make_home("2x80GiB")
    state = place(bases["clean"], home)
    bad_page(state)
    out = home.run("doctor", "--repair").stdout
    assert "the queue file was corrupt" in out
    assert home.submit("--", "true") == 5  # ids carry on above the old queue's
    assert home.run("doctor").returncode == 0


def test_a_healthy_queue_is_left_alone_and_repair_waits_for_the_daemon(bases, make_home):
    home = make_home("2x80GiB")
    state = place(bases["crashed"], home)
    before = fingerprint(state)
    # Not running: doctor reads through a private copy; nothing changes.
    report = json.loads(home.run("doctor", "--json").stdout)
    assert report["healthy"] is True and report["jobs"] == 7 and report["last_id"] == 7
    assert fingerprint(state) == before
    home.start()
    proc = home.run("doctor", "--repair", check=False)
    assert proc.returncode == 1 and "a gpusched daemon runs for" in proc.stderr
    assert "gpusched daemon stop" in proc.stderr
    assert home.run("doctor").returncode == 0  # read live, while the daemon runs
    home.run("daemon", "stop")
    out = home.run("doctor", "--repair").stdout
    assert "nothing to repair" in out
    assert not list(state.glob("queue.db.damaged-*"))


def test_doctor_points_at_job_files_above_the_queue_and_loose_permissions(bases, make_home):
    home = make_home("2x80GiB")
    state = place(bases["clean"], home)
    (state / "jobs" / "40.run.jsonl").write_text("{}\n")  # would be read as a new job 40's
    state.chmod(0o755)
    proc = home.run("doctor", check=False)
    assert proc.returncode == 1
    assert "holds files of job(s) 40 above the queue's last id 4" in proc.stdout
    assert f"the state directory {state} is open to others (mode 0755)" in proc.stdout


BIG_ID = 2**48  # past what a pending job's place in line can hold (core/sched/pendingqueue.py)


def test_a_pending_row_with_an_id_past_the_largest_is_quarantined_and_doctor_says_so(
    bases, make_home
):
    """A pending row with id 2**48 (written by hand) crashed the daemon at every start,
    while `doctor` said the queue was healthy; and new ids carried on above it."""
    home = make_home("2x80GiB")
    state = place(bases["crashed"], home)
    sql(
        state / "queue.db",
        "CREATE TEMP TABLE big AS SELECT * FROM jobs WHERE id = 6",
        f"UPDATE big SET id = {BIG_ID}, held = 0",
        "INSERT INTO jobs SELECT * FROM big",
    )
    proc = home.run("doctor", check=False)
    assert proc.returncode == 1, proc.stdout
    assert f"job {BIG_ID} is damaged (id {BIG_ID} is outside the job ids" in proc.stdout
    listed = {j["id"]: j["state"] for j in home.jobs()}  # the daemon starts
    assert listed == {
        1: "succeeded",
        2: "succeeded",
        3: "succeeded",
        4: "pending",
        5: "pending",
        6: "pending",
        7: "pending",
    }
    status = json.loads(home.run("daemon", "status", "--json").stdout)
    assert [d["id"] for d in status["damaged_jobs"]] == [BIG_ID]
    new = home.submit("--", "true")
    assert new == 8  # not above the damaged row
    home.wait_state(new, "succeeded")
    home.run("daemon", "stop")
    repaired = home.run("doctor", "--repair").stdout
    assert f"could not save job {BIG_ID}: id {BIG_ID} is outside the job ids" in repaired
    assert "new jobs get ids from 9" in repaired, repaired
