"""The job supervisor (gpusched/proc/supervisor/main.py): plain jobs started and watched without a
shim of their own, through daemon restarts, a killed supervisor, and many ends at once
(real CLI, real daemon, real processes; only the GPUs are simulated)."""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import psutil
import pytest

from conftest import Home, find_shim, is_gone, wait_until
from gpusched.client.paths import resolve_paths
from gpusched.daemon.jobs import lostrunners
from gpusched.proc import runfile
from gpusched.proc.supervisor.main import HELLO, SOCKET_NAME


def gate(path: Path, code: int = 0) -> str:
    """A shell job that waits for `path` to exist, then exits with `code`."""
    return f"until [ -e {path} ]; do sleep 0.05; done; exit {code}"


def supervised_job(home: Home, job_id: int) -> psutil.Process:
    """The job's own process, as its run file records it; its parent is the supervisor."""
    pid, _ = wait_until(lambda: find_shim(home.state / "jobs", job_id), "the job's pid")
    assert runfile.read_run(home.state / "jobs", job_id).shim.supervised
    return psutil.Process(pid)


def test_a_plain_job_runs_under_the_supervisor_in_a_session_of_its_own(home, tmp_path):
    job_id = home.submit("--gpus", "0", "--", "sh", "-c", gate(tmp_path / "go"))
    job = supervised_job(home, job_id)
    supervisor = job.parent()
    assert "proc/supervisor/main.py" in " ".join(supervisor.cmdline())
    assert os.getsid(job.pid) == job.pid and os.getpgid(job.pid) == job.pid
    assert home.show(job_id)["state"] == "running"
    (tmp_path / "go").touch()
    assert home.wait_state(job_id, "succeeded", "failed")["state"] == "succeeded"


def test_a_plain_jobs_exit_status_is_kept_across_a_daemon_sigkill_and_restart(home, tmp_path):
    job_id = home.submit("--gpus", "0", "--", "sh", "-c", gate(tmp_path / "go", 7))
    still = home.submit("--gpus", "0", "--", "sh", "-c", gate(tmp_path / "later"))
    supervisor = supervised_job(home, job_id).parent()
    assert supervised_job(home, still).parent().pid == supervisor.pid
    home.kill_daemon()

    (tmp_path / "go").touch()  # the job ends while no daemon runs: the supervisor records it
    wait_until(lambda: runfile.read_run(home.state / "jobs", job_id).exit, "the exit record")
    assert not is_gone(supervisor)  # it outlives the daemon while it has jobs

    home.start()
    ended = home.wait_state(job_id, "failed", "succeeded", "lost")
    assert (ended["state"], ended["exit_code"]) == ("failed", 7)
    # The new daemon connects to the same supervisor: its next job goes there too.
    again = home.submit("--gpus", "0", "--", "sh", "-c", gate(tmp_path / "later"))
    assert supervised_job(home, again).parent().pid == supervisor.pid
    (tmp_path / "later").touch()
    for job_id in (still, again):
        assert home.wait_state(job_id, "succeeded", "failed")["state"] == "succeeded"


def test_the_jobs_of_a_killed_supervisor_are_reported_lost_with_the_reason(make_home, tmp_path):
    home = make_home()
    home.write_config('[daemon]\ngpu_poll_interval = "1s"\ncancel_grace = "1s"\n')
    home.start()
    ids = [home.submit("--gpus", "0", "--", "sh", "-c", gate(tmp_path / "never")) for _ in range(3)]
    jobs = [supervised_job(home, job_id) for job_id in ids]
    os.kill(jobs[0].parent().pid, signal.SIGKILL)

    for job_id in ids:
        lost = home.wait_state(job_id, "lost", "failed", "succeeded")
        assert lost["state"] == "lost"
        assert lost["end_reason"].startswith(lostrunners.SUPERVISOR_VANISHED), lost["end_reason"]
    assert all(is_gone(job) for job in jobs)
    # A new supervisor takes the next job.
    after = home.submit("--gpus", "0", "--wait", "--", "true")
    assert home.show(after)["state"] == "succeeded"


def test_many_jobs_ending_at_once_each_keep_their_own_exit_status(make_home, tmp_path):
    home = make_home()
    home.write_config("[host]\ncpus = 64\n[jobs]\nmax_running = 12\n")
    home.start()
    go = tmp_path / "go"
    ids = [home.submit("--gpus", "0", "--", "sh", "-c", gate(go, code)) for code in range(12)]
    for job_id in ids:
        supervised_job(home, job_id)
    go.touch()
    for code, job_id in enumerate(ids):
        ended = home.wait_state(job_id, "failed", "succeeded", "lost")
        assert ended["exit_code"] == code, ended
        assert runfile.read_run(home.state / "jobs", job_id).exit.exit_code == code


def test_cancel_of_a_plain_job_that_ignores_sigterm_kills_it_after_the_grace(make_home, tmp_path):
    home = make_home()
    home.write_config('[daemon]\ncancel_grace = "1s"\n')
    home.start()
    ready = tmp_path / "ready"
    job_id = home.submit(
        "--gpus",
        "0",
        "--",
        "sh",
        "-c",
        f"trap '' TERM; touch {ready}; while :; do sleep 0.05; done",
    )
    job = supervised_job(home, job_id)
    wait_until(ready.exists, "the job to ignore SIGTERM")
    home.run("cancel", str(job_id))
    ended = home.wait_state(job_id, "cancelled", "failed", "succeeded", "lost")
    assert ended["state"] == "cancelled" and ended["signal"] == signal.SIGKILL, ended
    assert is_gone(job)


# A job that ignores SIGTERM, as a user wrote it: only the grace's SIGKILL ends it.
TERM_IGNORER = "trap '' TERM; touch {ready}; while :; do sleep 1; done"
STOPPED = ("cancelled", "timeout", "failed", "succeeded", "lost")


def adopted_term_ignorer(make_home, tmp_path: Path, runner: str, how: str, *submit: str):
    """A TERM-ignoring job (runner: "supervisor", or "shim": a capped log gives it one)
    whose pid the daemon has stored, adopted by a daemon restarted (how: "restart") or
    started by the first command after a SIGKILL ("sigkill"): (home, job id, the pid
    the daemon watches, the job's or its shim's)."""
    home = make_home()
    capped = '[jobs]\nmax_log_size = "1M"\n' if runner == "shim" else ""
    home.write_config(f'[daemon]\ngpu_poll_interval = "1s"\ncancel_grace = "1s"\n{capped}')
    home.start()
    ready = tmp_path / "ready"
    job_id = home.submit(*submit, "--", "sh", "-c", TERM_IGNORER.format(ready=ready))
    recorded = wait_until(lambda: runfile.read_run(home.state / "jobs", job_id).shim, "its pid")
    assert recorded.supervised == (runner == "supervisor")
    wait_until(ready.exists, "the job to ignore SIGTERM")
    # Its memory peak is stored with the job, its pid with it: the restarted daemon has it.
    wait_until(lambda: home.show(job_id)["mem_peak_bytes"], "a stored memory peak")
    if how == "restart":
        home.run("daemon", "restart")
    else:
        home.kill_daemon()
    return home, job_id, recorded.pid


@pytest.mark.parametrize(
    "runner, how", [("supervisor", "restart"), ("supervisor", "sigkill"), ("shim", "restart")]
)
def test_an_adopted_job_that_ignores_sigterm_is_cancelled_after_the_grace(
    make_home, tmp_path, runner, how
):
    home, job_id, watched = adopted_term_ignorer(make_home, tmp_path, runner, how, "--gpus", "1")
    home.run("cancel", str(job_id))  # after a SIGKILL, this command starts the daemon
    ended = home.wait_state(job_id, *STOPPED, timeout=30)
    assert ended["state"] == "cancelled" and ended["signal"] == signal.SIGKILL, ended
    assert is_gone(watched)


def test_an_adopted_job_that_ignores_sigterm_stops_at_its_time_limit(make_home, tmp_path):
    home, job_id, _ = adopted_term_ignorer(
        make_home, tmp_path, "supervisor", "restart", "--gpus", "1", "--time", "8s"
    )
    ended = home.wait_state(job_id, *STOPPED, timeout=40)
    assert ended["state"] == "timeout" and ended["signal"] == signal.SIGKILL, ended


def test_a_job_whose_environment_exec_refuses_fails_alone_and_the_supervisor_serves_on(
    home, tmp_path
):
    # The daemon refuses such an environment (values.environment); one that reaches the
    # supervisor all the same (a spec of an older daemon's) must fail that job's start
    # only: before, posix_spawn's ValueError ended the supervisor, and every job it
    # watched was lost.
    job_id = home.submit("--gpus", "0", "--", "sh", "-c", gate(tmp_path / "go"))
    supervisor = supervised_job(home, job_id).parent()
    jobs_root = home.state / "jobs"
    with open(runfile.run_file(jobs_root, job_id), "rb") as run:
        spec = json.loads(run.readline())
    bad_id = job_id + 1000
    del spec["record"]
    spec.update(
        job_id=bad_id,
        run_file=runfile.run_file(jobs_root, bad_id),
        run="bad-env",
        env={**spec["env"], "A=B": "x"},
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as link:
        link.connect(os.path.join(resolve_paths(home.env).run_dir, SOCKET_NAME))
        assert link.recv(100).startswith(HELLO)
        link.sendall(json.dumps(spec).encode() + b"\n")
    ended = wait_until(
        lambda: is_gone(supervisor) or runfile.read_run(jobs_root, bad_id).exit,
        "the bad job's start to fail",
    )
    assert not is_gone(supervisor)
    assert ended.exit_code == 127 and "environment" in ended.error, ended
    (tmp_path / "go").touch()
    assert home.wait_state(job_id, "succeeded", "failed", "lost")["state"] == "succeeded"


@pytest.mark.parametrize("shim", [False, True], ids=["supervised", "shim"])
def test_a_start_is_acknowledged_with_the_pid_its_run_file_records(home, tmp_path, shim):
    # The daemon learns the pid to watch from the acknowledgement, not a later read of
    # the run file: both must name the same process.
    job_id = home.submit("--gpus", "0", "--", "sh", "-c", gate(tmp_path / "go"))
    jobs_root = home.state / "jobs"
    supervised_job(home, job_id)
    with open(runfile.run_file(jobs_root, job_id), "rb") as run:
        spec = json.loads(run.readline())
    new_id = job_id + 1000
    del spec["record"]
    spec.update(job_id=new_id, run_file=runfile.run_file(jobs_root, new_id), run=f"{new_id}.1")
    if shim:
        spec["max_log_bytes"] = 1 << 20  # a capped log: its own shim
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as link:
        link.connect(os.path.join(resolve_paths(home.env).run_dir, SOCKET_NAME))
        link.settimeout(30)
        assert link.recv(100).startswith(HELLO)
        link.sendall(json.dumps(spec).encode() + b"\n")
        reply = b""
        while not reply.endswith(b"\n"):
            reply += link.recv(4096)
    ack = json.loads(reply)
    recorded = wait_until(lambda: runfile.read_run(jobs_root, new_id, spec["run"]).shim, "its pid")
    assert (ack["started"], ack["run"]) == (new_id, spec["run"])
    assert (ack["pid"], ack["start_ticks"], ack["supervised"]) == tuple(recorded)
    assert ack["supervised"] is not shim
    (tmp_path / "go").touch()
    wait_until(lambda: runfile.read_run(jobs_root, new_id, spec["run"]).exit, "its end")
    assert home.wait_state(job_id, "succeeded", "failed", "lost")["state"] == "succeeded"
