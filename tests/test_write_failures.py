"""Writes to the queue that fail for real, through the CLI and a real daemon: another process
holding the queue's lock, and a full disk (a small tmpfs as the state directory). A refused
submit says why in one line and never runs; the daemon stays up, answers reads, says why in
`daemon status` and `ls`, records the ends it could not store, and recovers by itself."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import wait_until

LOCK_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()  # until the test closes it
"""


def hold_queue_lock(db: Path) -> subprocess.Popen:
    """Another process that takes the queue's write lock and keeps it (as an sqlite3
    shell left in a transaction would)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    return holder


def let_go(holder: subprocess.Popen) -> None:
    holder.stdin.close()
    holder.wait(timeout=30)
    holder.stdout.close()


def write_problem(home) -> dict | None:
    return json.loads(home.run("daemon", "status", "--json").stdout)["write_problem"]


def log_text(home) -> str:
    return (home.state / "daemon.log").read_text(errors="replace")


def test_a_held_lock_refuses_a_submit_in_words_and_ends_are_kept(home, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    home.start()
    ended = home.submit("--", "sh", "-c", f"while [ ! -e {out}/go ]; do sleep 0.05; done; exit 3")
    home.wait_state(ended, "running")
    holder = hold_queue_lock(home.state / "queue.db")
    try:
        proc = home.run("submit", "--", "touch", str(out / "refused"), check=False)
        assert proc.returncode == 1
        assert proc.stderr.startswith(
            "Error: the queue cannot be written: the queue is locked "
            "by another process (database is locked). Close what holds "
        )
        assert proc.stderr.endswith("; nothing was queued.\n") and proc.stderr.count("\n") == 1
        (out / "go").touch()  # the job ends while its end cannot be stored
        listing = home.run("ls", "--json")
        assert [j["id"] for j in json.loads(listing.stdout)] == [ended]
        assert listing.stderr.startswith("Warning: the queue cannot be written since ")
        assert "the queue is locked by another process" in listing.stderr
        assert write_problem(home)["cause"] == (
            "the queue is locked by another process (database is locked)"
        )
        assert "writes: FAILING: " in home.run("daemon", "status").stdout
    finally:
        let_go(holder)
    wait_until(lambda: write_problem(home) is None, "the daemon to write again")
    job = home.wait_state(ended, "failed")
    assert job["exit_code"] == 3
    assert [j["id"] for j in home.jobs()] == [ended]
    assert not (out / "refused").exists()
    assert home.run("ls").stderr == ""
    log = log_text(home)
    assert log.count("writes to the queue fail: the queue is locked by another process") == 1
    assert log.count("writes to the queue work again") == 1


# -- a full disk ---------------------------------------------------------------------------------
@pytest.fixture
def small_state_dir(home):
    """The home's state directory on a 2 MiB tmpfs (root only: the test skips elsewhere);
    the daemon is stopped before it is unmounted."""
    state = home.state
    state.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(state)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield state
    finally:
        home.cleanup()
        subprocess.run(["umount", str(state)], check=True)


def fill(directory: Path) -> Path:
    """A file that takes every byte left on the filesystem of `directory`."""
    path = directory / "filler"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        chunk = 1 << 16
        while chunk:
            try:
                os.write(fd, b"\0" * chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                chunk //= 2
    finally:
        os.close(fd)
    return path


def test_a_full_disk_refuses_submits_that_never_run_and_the_daemon_recovers(
    home, small_state_dir, tmp_path
):
    out = tmp_path / "out"
    out.mkdir()
    home.start()
    first = home.submit("--", "true")
    home.wait_state(first, "succeeded")
    filler = fill(small_state_dir)
    refusals = []
    for n in range(3):
        proc = home.run("submit", "--", "touch", str(out / f"refused-{n}"), check=False)
        assert proc.returncode == 1
        refusals.append(proc.stderr)
    assert all(
        r.startswith(
            "Error: the queue cannot be written: the disk is full (database "
            f"or disk is full). Free space on the filesystem of {small_state_dir}"
        )
        and r.endswith("; nothing was queued.\n")
        for r in refusals
    ), refusals
    # The daemon is up and answers reads, saying why writes fail.
    assert [j["id"] for j in home.jobs()] == [first]
    assert "the disk is full" in home.run("ls").stderr
    assert write_problem(home)["cause"].startswith("the disk is full")
    filler.unlink()
    wait_until(lambda: write_problem(home) is None, "the daemon to write again")
    after = home.submit("--", "touch", str(out / "after"))
    assert after > first + len(refusals)  # the refused submits' ids are not given again
    assert home.wait_state(after, "succeeded")
    assert [j["id"] for j in home.jobs()] == [first, after]
    assert sorted(p.name for p in out.iterdir()) == ["after"]
    # (The line saying why writes failed may be lost: the log is on the full disk too.)
    assert "writes to the queue work again" in log_text(home)
