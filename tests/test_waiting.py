"""Waiting on jobs as a person does: `logs` of a job that has not started, and Ctrl-C
(a real SIGINT) during `submit --wait` and `wait`: the jobs go on, and the CLI says so."""

from __future__ import annotations

import select
import signal
import subprocess
import sys
import time

import psutil

from conftest import DEADLINE_S, wait_until


def as_at_a_terminal() -> None:
    """In the child: SIGINT as a terminal's shell leaves it. A test run started in the
    background of a non-interactive shell (as CI may) inherits it ignored, and Python
    keeps an ignored SIGINT ignored, so no Ctrl-C would reach the command."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def gpusched(home, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "gpusched", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=home.env,
        cwd=home.path,
        preexec_fn=as_at_a_terminal,
    )


def read_line(stream, what: str) -> str:
    """The next line of a child's pipe, within the deadline (a readline could hang)."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], 0.2)
        if ready:
            return stream.readline()
    raise AssertionError(f"timed out waiting for {what}")


def talking_to_the_daemon(proc: subprocess.Popen) -> bool:
    """Whether the CLI holds a connection to the daemon: each call opens one and closes it
    before the next, so after the submit call (its id printed) one is the wait's."""
    try:
        return bool(psutil.Process(proc.pid).net_connections(kind="unix"))
    except psutil.Error:
        return False


def interrupt(proc: subprocess.Popen) -> tuple[int, str, str]:
    """Ctrl-C as a terminal sends it: SIGINT to the CLI, once it is waiting."""
    wait_until(lambda: talking_to_the_daemon(proc), "the CLI to wait on the daemon")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=DEADLINE_S)
    return proc.returncode, out, err


def test_logs_of_a_pending_job_says_it_has_not_started(home):
    home.start()
    job_id = home.submit("--hold", "--", "echo", "hello")
    proc = home.run("logs", str(job_id))
    assert proc.returncode == 0 and proc.stdout == ""
    assert proc.stderr.startswith(f"job {job_id} has not started yet (pending: held")
    assert f"`gpusched logs -f {job_id}` waits for it" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_logs_follow_of_a_pending_job_waits_for_its_start_then_follows(home):
    home.start()
    job_id = home.submit("--hold", "--", "sh", "-c", "echo hello; echo world")
    follow = gpusched(home, "logs", "-f", str(job_id))
    try:
        note = read_line(follow.stderr, "the note on stderr")
        assert note.startswith(f"job {job_id} has not started yet (pending: held")
        assert "waiting for it to start, then following its output" in note
        assert follow.poll() is None  # it waits
        home.run("release", str(job_id))
        out, err = follow.communicate(timeout=DEADLINE_S)
    finally:
        follow.kill()
        follow.wait()
    assert follow.returncode == 0 and out == "hello\nworld\n"
    assert err == ""  # said once


def test_ctrl_c_during_submit_wait_says_the_job_keeps_running(home):
    home.start()
    proc = gpusched(home, "submit", "--wait", "--", "sleep", "300")
    job_id = int(read_line(proc.stdout, "the job id"))
    home.wait_state(job_id, "running")
    status, _, err = interrupt(proc)
    assert status == 130
    assert err == (
        f"Interrupted: stopped waiting; job {job_id} keeps running. "
        f"`gpusched cancel {job_id}` cancels it.\n"
    )
    assert home.show(job_id)["state"] == "running"


def test_ctrl_c_during_submit_wait_of_a_queued_job_says_it_stays_queued(home):
    home.start()
    proc = gpusched(home, "submit", "--wait", "--hold", "--", "true")
    job_id = int(read_line(proc.stdout, "the job id"))
    status, _, err = interrupt(proc)
    assert status == 130
    assert f"job {job_id} stays queued. `gpusched cancel {job_id}` cancels it." in err
    assert home.show(job_id)["state"] == "pending"


def test_ctrl_c_during_wait_says_the_jobs_keep_running(home):
    home.start()
    running = home.submit("--", "sleep", "300")
    queued = home.submit("--hold", "--", "true")
    home.wait_state(running, "running")
    proc = gpusched(home, "wait", str(running), str(queued))
    status, out, err = interrupt(proc)
    assert status == 130 and out == ""
    assert err == (
        f"Interrupted: stopped waiting; job {running} keeps running and job "
        f"{queued} stays queued. `gpusched cancel {running} {queued}` cancels "
        "them.\n"
    )
    assert [home.show(i)["state"] for i in (running, queued)] == ["running", "pending"]
