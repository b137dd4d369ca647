"""`submit -o/-e` in system mode: the root daemon's jobs open their output files as their
user, so a user can never make root create, truncate or write a file the user could
not; and the daemon's own reads and notes touch only files of the job's user."""

from __future__ import annotations

import os
from pathlib import Path

from test_system_mode import make_system, pytestmark, system, users  # noqa: F401 - fixtures

from gpusched.core.values import HIDDEN
from gpusched.proc import privileges


def test_a_users_output_file_is_made_as_the_user_in_the_working_directory(system, users):
    alice, bob = users
    out_dir = Path(alice.home) / "runs"
    out_dir.mkdir()
    os.chown(out_dir, alice.uid, alice.gid)
    job_id = int(system.run_as(alice, "submit", "-o", "runs/%u-%j.out", "--", "sh", "-c",
                               "id -u; echo err >&2", cwd=alice.home).stdout)
    job = system.wait_state(job_id, "succeeded", "failed")
    assert job["state"] == "succeeded", job["end_reason"]
    chosen = out_dir / f"{alice.name}-{job_id}.out"
    assert chosen.read_text() == f"{alice.uid}\nerr\n"
    assert (chosen.stat().st_uid, chosen.stat().st_gid) == (alice.uid, alice.gid)
    assert system.run_as(alice, "logs", str(job_id)).stdout == f"{alice.uid}\nerr\n"
    seen = system.json_as(bob, "show", str(job_id))  # another user sees no path of alice's
    assert seen["stdout_path"] == seen["output_pattern"] == seen["error_pattern"] == HIDDEN


def test_a_user_cannot_make_the_daemon_write_a_file_the_user_cannot(system, users):
    alice, _ = users
    guarded = system.path / "guarded"
    guarded.mkdir(mode=0o755)  # root's: alice may look in, not write
    target = guarded / "roots.txt"
    target.write_text("root's own\n")
    link = Path(alice.home) / "link.out"
    link.symlink_to(target)
    os.chown(link, alice.uid, alice.gid, follow_symlinks=False)
    ids = [int(system.run_as(alice, "submit", *options, "--", "echo", "written",
                             cwd=alice.home).stdout)
           for options in (["-o", "link.out"],  # a link to root's file, truncate
                           ["-e", str(target), "--open-mode=append"],  # root's file itself
                           ["-o", str(guarded / "new.out")])]  # a file in root's directory
    for job_id in ids:
        job = system.wait_state(job_id, "succeeded", "failed")
        assert job["state"] == "failed"
        assert job["end_reason"].endswith("permission denied"), job["end_reason"]
    assert target.read_text() == "root's own\n"
    assert sorted(p.name for p in guarded.iterdir()) == ["roots.txt"]


def test_a_fifo_as_a_users_output_fails_the_job_rather_than_holding_it(system, users):
    """Opened as the user, a FIFO nobody reads would hold the job before its exec, its
    shim deaf to the cancel: refused at the start, with the reason."""
    alice, _ = users
    pipe = Path(alice.home) / "pipe"
    os.mkfifo(pipe)
    os.chown(pipe, alice.uid, alice.gid)
    job_id = int(system.run_as(alice, "submit", "--time", "5s", "-o", "pipe", "--",
                               "sleep", "600", cwd=alice.home).stdout)
    job = system.wait_state(job_id, "failed", "succeeded", "timeout", "cancelled")
    assert job["state"] == "failed", job
    assert job["end_reason"] == (f"cannot start: output {pipe} is a FIFO (named pipe); "
                                 "give a regular file, a terminal or /dev/null")


def test_the_daemon_opens_only_regular_files_of_the_jobs_user(tmp_path):
    """What the root daemon reads of a job's logs (the CUDA out-of-memory scan) and writes
    into them (its notes): never a file of another user, a link, or a FIFO."""
    uid = 54321
    own = tmp_path / "own.out"
    own.write_text("x")
    os.chown(own, uid, uid)
    others = tmp_path / "others.out"
    others.write_text("x")
    (tmp_path / "link.out").symlink_to(own)
    os.mkfifo(tmp_path / "fifo.out")
    os.chown(tmp_path / "fifo.out", uid, uid)
    fd = privileges.open_owned(str(own), os.O_RDONLY, uid)
    assert fd is not None
    os.close(fd)
    for name in ("others.out", "link.out", "fifo.out", "missing.out"):
        assert privileges.open_owned(str(tmp_path / name), os.O_WRONLY, uid) is None, name
