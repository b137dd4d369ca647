"""The shim reaches processes that left the job's process group (torchrun's workers do)."""

import os
import signal
import subprocess

import psutil
import pytest

from conftest import is_gone, wait_until
from gpusched.proc import jobtree, runfile

pytestmark = pytest.mark.e2e

# The job starts a child in a session of its own (as torchrun does with its workers),
# and waits for a file before ending. The child writes its own pid once it is in its new
# session (the job's `$!` would be there before setsid has run), then becomes the sleep.
ESCAPER = (
    "sh",
    "-c",
    "setsid sh -c 'echo $$ > escaped.tmp && mv escaped.tmp escaped.pid && "
    "exec sleep 300' & while [ ! -e end ]; do sleep 0.05; done",
)


def _escaped(home) -> psutil.Process:
    pid_file = home.path / "escaped.pid"
    wait_until(pid_file.exists, "the escaped pid")
    return psutil.Process(int(pid_file.read_text()))


def test_a_process_in_its_own_session_dies_when_the_job_ends(home):
    job_id = home.submit("--", *ESCAPER)
    escaped = _escaped(home)
    assert escaped.is_running() and os.getpgid(escaped.pid) == escaped.pid  # its own group
    (home.path / "end").touch()
    home.wait_state(job_id, "succeeded")
    wait_until(lambda: is_gone(escaped), "the escaped process to be killed")


def test_cancel_reaches_a_process_in_its_own_session(home):
    home.write_config('[daemon]\ncancel_grace = "30s"\n')
    job_id = home.submit("--", *ESCAPER)
    escaped = _escaped(home)
    home.run("cancel", str(job_id))
    home.wait_state(job_id, "cancelled")
    wait_until(lambda: is_gone(escaped), "the escaped process to get SIGTERM")


# Both runners start a job through proc/spawn.py and report a failed start the same way: the
# job supervisor starts a plain job itself; a capped log needs a shim of its own.
RUNNERS = [
    pytest.param("", id="supervisor"),
    pytest.param('[jobs]\nmax_log_size = "4K"\n', id="shim"),
]


@pytest.mark.parametrize("config", RUNNERS)
def test_a_command_that_cannot_start_fails_with_127_and_says_why(home, config):
    home.write_config(config)
    missing = home.submit("--", "no-such-command-gpusched")
    job = home.wait_state(missing, "failed")
    assert job["exit_code"] == 127
    why = "cannot start: no such command 'no-such-command-gpusched' in PATH"
    assert job["end_reason"].startswith(why)
    assert f"gpusched: {why}" in home.run("logs", "--stderr", str(missing)).stdout


@pytest.mark.parametrize("config", RUNNERS)
def test_a_working_directory_gone_before_the_start_fails_with_127_and_says_why(
    home, tmp_path, config
):
    home.write_config(config)
    doomed = tmp_path / "doomed"
    doomed.mkdir()
    job_id = home.submit("--hold", "--cwd", str(doomed), "--", "true")
    doomed.rmdir()
    home.run("release", str(job_id))
    job = home.wait_state(job_id, "failed")
    why = f"cannot start: working directory {doomed} no longer exists"
    assert (job["exit_code"], job["end_reason"]) == (127, why)
    assert home.run("logs", "--stderr", str(job_id)).stdout == f"gpusched: {why}\n"


@pytest.mark.parametrize("config", RUNNERS)
def test_a_job_whose_run_file_cannot_be_made_fails_and_the_daemon_carries_on(home, config):
    """A run file that cannot be made (a directory in its place) fails that job only, at
    once: its runner says so in its wake-up, having nowhere else to write it, and the
    supervisor goes on to start the next job (the daemon's side is in test_inproc_runs.py,
    with a runner that never starts)."""
    home.write_config(config)
    home.start()
    jobs_dir = home.state / "jobs"
    jobs_dir.mkdir(parents=True, exist_ok=True)
    next_id = 1 + max([j["id"] for j in home.jobs()], default=0)
    os.makedirs(runfile.run_file(jobs_dir, next_id))
    job = home.wait_state(home.submit("--", "true"), "failed", "succeeded")
    assert job["state"] == "failed"
    assert job["end_reason"].startswith("cannot start its shim: cannot create its run file")
    assert home.wait_state(home.submit("--", "true"), "succeeded")["exit_code"] == 0


def test_a_second_sigterm_never_puts_off_the_graces_sigkill():
    """The shim's grace counts from the first SIGTERM, as the supervisor's does: a cancel
    repeated (or one after a time limit's SIGTERM) must not start it again."""
    job = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 300"], start_new_session=True)
    forward = jobtree.Forwarder(job.pid, 100.0, group_only=True)  # its group only
    try:
        forward(signal.SIGTERM, None)
        first_s = signal.getitimer(signal.ITIMER_REAL)[0]
        assert 0 < first_s <= 100
        forward.grace_s = 1000.0
        forward(signal.SIGTERM, None)
        assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= first_s
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
