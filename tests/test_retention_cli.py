"""Retention end to end: a real daemon in a temporary home, driven by the real CLI: gc and
its dry run, keep_finished at start-up, id-range subdirectories, a home of flat files."""

from __future__ import annotations

import json
import shutil
import sqlite3
import time

from conftest import wait_until


def ended(home, *ids: int) -> None:
    for job_id in ids:
        home.wait_state(job_id, "succeeded")


def listed(home) -> list[int]:
    return [job["id"] for job in home.jobs()]


def test_gc_dry_run_says_what_would_go_and_gc_removes_jobs_and_files(home):
    home.write_config("[jobs]\nkeep_finished_count = 2\n")
    ids = [home.submit("--", "sh", "-c", f"echo out{i}; echo err{i} >&2") for i in range(4)]
    ended(home, *ids)
    files = {i: sorted(p for p in home.state.joinpath("jobs").rglob(f"{i}.*")) for i in ids}
    assert all(len(found) == 3 for found in files.values())  # run file and two logs
    size = sum(p.stat().st_size for i in ids[:2] for p in files[i])
    dry = home.run("gc", "--dry-run").stdout
    assert dry.startswith("would remove 2 finished job(s) and ")
    assert "ended between" in dry and "kept for 30d00h and at most the newest 2" in dry
    assert json.loads(home.run("gc", "--dry-run", "--json").stdout)["bytes"] == size
    assert listed(home) == ids
    done = home.run("gc")
    assert done.stdout.startswith("removed 2 finished job(s)") and done.stderr == ""
    assert listed(home) == ids[2:]
    assert not any(p.exists() for i in ids[:2] for p in files[i])
    assert home.run("logs", str(ids[3])).stdout == "out3\n"
    proc = home.run("logs", str(ids[0]), check=False)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("Error: ")
    removed = json.loads(home.run("daemon", "status", "--json").stdout)["removed_jobs"]
    assert removed["jobs"] == 2
    assert json.loads(home.run("gc", "--json").stdout)["jobs"] == 0


def test_the_daemon_removes_jobs_past_keep_finished_by_itself(home):
    home.write_config('[jobs]\nkeep_finished = "1s"\n')
    job_id = home.submit("--", "true")
    job = home.wait_state(job_id, "succeeded")
    wait_until(lambda: time.time() > job["ended_at"] + 1.5, "the job to be older than 1 s")
    home.run("daemon", "stop")
    home.start()  # a sweep at start-up
    wait_until(lambda: listed(home) == [], "the old job to be removed")
    assert not list(home.state.joinpath("jobs").rglob(f"{job_id}.*"))


def test_gc_refuses_a_bad_command_line_in_one_line(home):
    proc = home.run("gc", "--now", check=False)
    assert proc.returncode == 2
    assert "--now" in proc.stderr and "Traceback" not in proc.stderr


def test_job_files_go_in_id_range_directories(home):
    held = home.json("submit", "--hold", "--array", "0-999", "--", "true")["ids"]
    assert held[-1] == 1000
    home.run("cancel", str(held[0]))
    job_id = home.submit("--", "sh", "-c", "echo thousand-and-one")
    assert job_id == 1001
    ended(home, job_id)
    jobs = home.state / "jobs"
    assert sorted(p.name for p in (jobs / "0001").iterdir()) == [
        "1001.run.jsonl",
        "1001.stderr.log",
        "1001.stdout.log",
    ]
    assert not list(jobs.glob("1001.*"))  # nothing flat
    assert home.show(job_id)["stdout_path"] == str(jobs / "0001" / "1001.stdout.log")
    assert home.run("logs", str(job_id)).stdout == "thousand-and-one\n"
    doctor = home.run("doctor", check=False).stdout
    assert "files of 1 job(s), each in the queue" in doctor


def flatten(home) -> None:
    """Lay the stopped home's job files out as versions before the subdirectories did:
    flat in the jobs directory, the queue naming them there."""
    jobs = home.state / "jobs"
    for folder in [p for p in jobs.iterdir() if p.is_dir()]:
        for path in folder.iterdir():
            path.rename(jobs / path.name)
        folder.rmdir()
    conn = sqlite3.connect(home.state / "queue.db")
    with conn:
        for column in ("stdout_path", "stderr_path"):
            conn.execute(f"UPDATE jobs SET {column} = replace({column}, '/jobs/0000/', '/jobs/')")
    conn.close()


def test_a_home_of_flat_files_from_an_older_version_keeps_working(home):
    home.write_config("[jobs]\nkeep_finished_count = 1\n")
    first = home.submit("--", "sh", "-c", "echo first")
    ended(home, first)
    home.run("daemon", "stop")
    flatten(home)
    jobs = home.state / "jobs"
    assert sorted(p.name for p in jobs.iterdir()) == [
        f"{first}.run.jsonl",
        f"{first}.stderr.log",
        f"{first}.stdout.log",
    ]
    home.start()
    assert home.run("logs", str(first)).stdout == "first\n"  # an old job's log, found
    assert "each in the queue" in home.run("doctor", check=False).stdout
    second = home.submit("--", "sh", "-c", "echo second")
    ended(home, second)
    assert (jobs / "0000" / f"{second}.stdout.log").read_text() == "second\n"
    assert home.run("gc").stdout.startswith("removed 1 finished job(s)")
    assert listed(home) == [second]
    assert sorted(p.name for p in jobs.iterdir()) == ["0000"]  # the flat files went too


def test_a_lost_queue_beside_subdirectories_of_job_files_is_refused(home):
    """Job files in the subdirectories still say that a queue was here: a new one would
    give their ids again."""
    ended(home, home.submit("--", "true"))
    home.run("daemon", "stop")
    jobs = home.state / "jobs"
    assert [p.name for p in jobs.iterdir()] == ["0000"]  # no file of it flat in jobs/
    (home.state / "queue.db").unlink()
    for sidecar in home.state.glob("queue.db*"):
        sidecar.unlink()
    proc = home.run("ls", check=False)
    assert proc.returncode == 1 and "files of 1 earlier job(s)" in proc.stderr
    shutil.rmtree(home.state / "jobs")
