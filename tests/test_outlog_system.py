"""`submit -o/-e` in system mode: the root daemon's jobs open their output files as their
user, so a user can never make root create, truncate or write a file the user could
not; and the daemon's own reads and notes touch only files of the job's user."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from gpusched.core.spec.values import HIDDEN
from gpusched.proc import privileges
from systemroot import pytestmark  # noqa: F401 - the module's marks


def test_a_users_output_file_is_made_as_the_user_in_the_working_directory(system, users):
    alice, bob = users
    out_dir = Path(alice.home) / "runs"
    out_dir.mkdir()
    os.chown(out_dir, alice.uid, alice.gid)
    job_id = int(
        system.run_as(
            alice,
            "submit",
            "-o",
            "runs/%u-%j.out",
            "--",
            "sh",
            "-c",
            "id -u; echo err >&2",
            cwd=alice.home,
        ).stdout
    )
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
    ids = [
        int(
            system.run_as(alice, "submit", *options, "--", "echo", "written", cwd=alice.home).stdout
        )
        for options in (
            ["-o", "link.out"],  # a link to root's file, truncate
            ["-e", str(target), "--open-mode=append"],  # root's file itself
            ["-o", str(guarded / "new.out")],
        )
    ]  # a file in root's directory
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
    job_id = int(
        system.run_as(
            alice, "submit", "--time", "5s", "-o", "pipe", "--", "sleep", "600", cwd=alice.home
        ).stdout
    )
    job = system.wait_state(job_id, "failed", "succeeded", "timeout", "cancelled")
    assert job["state"] == "failed", job
    assert job["end_reason"] == (
        f"cannot start: output {pipe} is a FIFO (named pipe); "
        "give a regular file, a terminal or /dev/null"
    )


@pytest.fixture
def shared_dir():
    """A directory every test user may pass and list (pytest's tmp_path is root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="gpss-outlog-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def owned(path: Path, user, text: str | None = "x", mode: int = 0o644) -> Path:
    """path, made a file with text (None: as it is) owned by user."""
    if text is not None:
        path.write_text(text)
    os.chown(path, user.uid, user.gid, follow_symlinks=False)
    if not path.is_symlink():
        path.chmod(mode)
    return path


def test_the_daemon_opens_only_regular_files_of_the_jobs_user_as_that_user(users, shared_dir):
    """What the root daemon reads of a job's logs (notification tails, the CUDA
    out-of-memory scan) and writes into them (its notes): only a regular file of the job's
    user that the user could open; never a file of another user, a link, a FIFO, a
    device, nor one reached through a link to a directory the user may not enter."""
    alice, bob = users
    own = owned(shared_dir / "own.out", alice)
    (shared_dir / "others.out").write_text("x")
    owned(shared_dir / "bobs.out", bob)
    (shared_dir / "link.out").symlink_to(own)
    owned(shared_dir / "link.out", alice, None)
    os.mkfifo(shared_dir / "fifo.out")
    owned(shared_dir / "fifo.out", alice, None, 0o666)
    private = shared_dir / "roots-only"
    private.mkdir(mode=0o700)
    owned(private / "own.out", alice)
    (shared_dir / "through").symlink_to(private)
    owned(shared_dir / "through", alice, None)
    fd = privileges.open_owned(str(own), os.O_RDONLY, alice.uid)
    assert fd is not None and os.read(fd, 10) == b"x"
    os.close(fd)
    for name in (
        "others.out",
        "bobs.out",
        "link.out",
        "fifo.out",
        "missing.out",
        "roots-only/own.out",
        "through/own.out",
        "/dev/zero",
    ):
        path = str(shared_dir / name)
        assert privileges.open_owned(path, os.O_WRONLY, alice.uid) is None, name
        assert privileges.open_owned(path, os.O_RDONLY, alice.uid) is None, name


def test_root_reads_a_users_log_only_as_that_user(system, users, shared_dir):
    """`gpusched logs ID` as root prints a job's log only if its owner could read it
    and it is a regular file of theirs: `-o /etc/shadow`, or a directory of the path
    swapped for a link to /dev or /etc, shows root nothing."""
    alice, _ = users
    shadow = system.submit(alice, "-o", "/etc/shadow", "--", "true")
    system.wait_state(shadow, "failed", "succeeded")
    runs = shared_dir / "runs"
    runs.mkdir()
    owned(runs, alice, None, 0o755)
    swapped = [
        system.submit(alice, "-o", str(runs / name), "--", "echo", "mine")
        for name in ("zero", "shadow")
    ]
    for job in swapped:
        system.wait_state(job, "succeeded")
    assert system.run_as(None, "logs", str(swapped[0])).stdout == "mine\n"
    os.rename(runs, shared_dir / "was-runs")
    for target, name in (("/dev", "zero"), ("/etc", "shadow")):
        os.symlink(target, runs)
        os.chown(runs, alice.uid, alice.gid, follow_symlinks=False)
        job = swapped[0] if name == "zero" else swapped[1]
        proc = system.run_as(None, "logs", str(job), check=False)
        assert proc.returncode == 1 and proc.stdout == "", (name, proc.stdout[:200])
        assert proc.stderr.startswith(f"Error: not showing the log of job {job}: "), proc.stderr
        os.unlink(runs)
    proc = system.run_as(None, "logs", str(shadow), check=False)
    assert proc.returncode == 1 and proc.stdout == "", proc.stdout[:200]
    assert proc.stderr == (
        f"Error: not showing the log of job {shadow}: /etc/shadow is not "
        f"a regular file of {alice.name}'s. Only such a file is shown\n"
    )
