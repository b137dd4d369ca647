"""A job whose shim is SIGKILLed: its processes are found without the shim and stopped, and
its GPU goes to no one until they are gone (real CLI, real daemon, real processes).

The daemon's decisions alone, with fake shims, are in tests/test_inproc_shim_death.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from conftest import Home, executable, find_shim, is_gone, wait_until
from gpusched.client.connection import Client
from gpusched.client.paths import resolve_paths
from gpusched.daemon.jobs import lostrunners
from gpusched.proc import leftovers, runfile
from gpusched.proc.seam import ProcessSeam

pytestmark = pytest.mark.e2e

# The job: a leader that forks a child, one that ignores SIGTERM (it ends by itself once
# GATE exists), and one that leaves the job's session with setsid(), ignoring SIGTERM too
# when STUBBORN_DETACHED is set. Each writes its pid to a file in OUT once it is set up.
JOB = r"""
import os, signal, sys, time
out, gate = sys.argv[1], sys.argv[2]

def note(name):
    with open(os.path.join(out, name + ".tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))

def child(name, setup):
    if os.fork() == 0:
        setup()
        note(name)
        while not (name == "stubborn" and os.path.exists(gate)):
            time.sleep(0.05)
        os._exit(0)

ignore_term = lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN)
child("child", lambda: None)
child("stubborn", ignore_term)
child("detached", lambda: (os.setsid(), os.environ.get("STUBBORN_DETACHED") and ignore_term()))
note("leader")
while True:
    time.sleep(1)
"""
NAMES = ("leader", "child", "stubborn", "detached")
# Run as the next job: which of the pids given are still running when it starts.
STILL_RUNNING = r"""
import sys
def running(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
print(" ".join(p for p in sys.argv[1:] if running(p)) or "none")
"""


def look(home: Home, job_id: int) -> dict:
    """The job as `show --json` has it, without a Python start-up per look."""
    return Client(resolve_paths(home.env), autostart=False).call("show", ids=[job_id])["jobs"][0]


def start_job(home: Home, tmp_path: Path, **env: str) -> tuple[int, dict[str, int], Path]:
    """A one-GPU job of JOB's processes, running: its id, their pids, and its gate."""
    out, gate = tmp_path / "pids", tmp_path / "gate"
    out.mkdir()
    script = executable(tmp_path / "job.py", JOB)
    job_id = home.submit(
        "--gpus",
        "1",
        *(f"--env={k}={v}" for k, v in env.items()),
        "--",
        sys.executable,
        str(script),
        str(out),
        str(gate),
    )
    wait_until(lambda: all((out / name).exists() for name in NAMES), "the job's processes")
    return job_id, {name: int((out / name).read_text()) for name in NAMES}, gate


# What watches a job: the supervisor, which starts plain jobs itself, or a shim of its own
# (a capped log needs one: gpusched/proc/supervisor/starts.py needs_shim).
WATCHERS = {"supervisor": "", "shim": '[jobs]\nmax_log_size = "100M"\n'}


def kill_shim(home: Home, job_id: int) -> str:
    """SIGKILL what watches the job (its shim, or the supervisor of a job without one);
    the lost reason's start that the daemon gives for that."""
    pid, _ = wait_until(lambda: find_shim(home.state / "jobs", job_id), "the shim's pid")
    if runfile.read_run(home.state / "jobs", job_id).shim.supervised:
        os.kill(psutil.Process(pid).ppid(), signal.SIGKILL)
        return lostrunners.SUPERVISOR_VANISHED
    os.kill(pid, signal.SIGKILL)
    return lostrunners.VANISHED


@pytest.mark.parametrize("watcher", WATCHERS)
def test_the_gpu_of_a_killed_shims_job_waits_until_its_processes_are_gone(
    make_home, tmp_path, watcher
):
    home = make_home("1x80GiB")
    # A long grace: the process that ignores SIGTERM ends when the test lets it.
    home.write_config(
        '[daemon]\ngpu_poll_interval = "1s"\ncancel_grace = "10m"\n' + WATCHERS[watcher]
    )
    home.start()
    job_id, pids, gate = start_job(home, tmp_path)
    waiting = home.submit(
        "--gpus", "1", "--", sys.executable, "-c", STILL_RUNNING, *map(str, pids.values())
    )
    vanished = kill_shim(home, job_id)
    assert vanished == (
        lostrunners.VANISHED if watcher == "shim" else lostrunners.SUPERVISOR_VANISHED
    )

    stopping = f"its {watcher} died; stopping its processes"
    job = wait_until(
        lambda: (j := look(home, job_id))["end_reason"].startswith(stopping) and j,
        "the daemon to stop the job's processes",
    )
    assert job["state"] == "running"
    # SIGTERM ended all but the one that ignores it, the one that left the session too.
    wait_until(
        lambda: all(is_gone(pids[n]) for n in ("leader", "child", "detached")),
        "the processes that take SIGTERM to end",
    )
    assert not is_gone(pids["stubborn"])
    row = next(
        line for line in home.run("ls").stdout.splitlines() if line.split()[0] == str(job_id)
    )
    assert "running" in row and stopping in row
    assert look(home, job_id)["shim_lost"] is True
    assert look(home, waiting)["state"] == "pending"

    # A new daemon finds the job as it was left: running, its GPU taken.
    home.run("daemon", "stop")
    home.start()
    assert look(home, job_id)["state"] == "running"
    assert look(home, waiting)["state"] == "pending"
    assert not is_gone(pids["stubborn"])

    gate.touch()  # the last process ends
    lost = home.wait_state(job_id, "lost", "failed", "succeeded")
    assert lost["end_reason"].startswith(
        f"{vanished}; gpusched stopped the processes it left (pid "
    ), lost["end_reason"]
    done = home.wait_state(waiting, "succeeded", "failed")
    assert done["gpus"] == job["gpus"]
    assert Path(done["stdout_path"]).read_text().strip() == "none"


def test_processes_that_ignore_sigterm_get_sigkill_and_no_one_elses_are_touched(
    make_home, tmp_path
):
    home = make_home("1x80GiB")
    home.write_config('[daemon]\ngpu_poll_interval = "1s"\ncancel_grace = "1s"\n')
    home.start()
    # It left the job's session and ignores SIGTERM: found by the job's run token alone.
    job_id, pids, _gate = start_job(home, tmp_path, STUBBORN_DETACHED="1")
    # A process that looks like the job's without being it: the same job id, but another
    # attempt's (or another home's) token.
    assert psutil.Process(pids["leader"]).environ().get("GPUSCHED_RUN_TOKEN") != "0" * 32
    decoy_env = {**os.environ, "GPUSCHED_JOB_ID": str(job_id), "GPUSCHED_RUN_TOKEN": "0" * 32}
    decoy = subprocess.Popen(["sleep", "600"], env=decoy_env, start_new_session=True)
    try:
        kill_shim(home, job_id)
        lost = home.wait_state(job_id, "lost", "failed", "succeeded")
        assert (
            "SIGTERM, then SIGKILL after the cancel grace) before freeing its GPUs"
            in lost["end_reason"]
        ), lost["end_reason"]
        assert all(is_gone(pid) for pid in pids.values())
        assert decoy.poll() is None, "a process that is not the job's was stopped"
    finally:
        decoy.kill()
        decoy.wait()


def test_a_process_in_the_jobs_cgroup_is_found_without_session_or_token(tmp_path):
    """Where the daemon made the job a cgroup (enforce_mem on cgroup v2), a process that
    left the session and cleared its environment is still the job's. The cgroup here is
    a stand-in directory: this machine may have no cgroup v2 tree of its own."""
    escaped = subprocess.Popen(["sleep", "600"], env={}, start_new_session=True)
    try:
        no_shim = 2**22 + 1  # above pid_max: no process, no session
        marks = leftovers.JobMarks(no_shim, 0, os.getuid(), "f" * 32, str(tmp_path))
        assert escaped.pid not in ProcessSeam.job_processes(marks)
        (tmp_path / "cgroup.procs").write_text(f"{escaped.pid}\n")
        found = ProcessSeam.job_processes(marks)
        assert list(found) == [escaped.pid]
        ProcessSeam.signal_processes(found, signal.SIGKILL)
        assert escaped.wait(timeout=30) == -signal.SIGKILL
    finally:
        escaped.kill()
        escaped.wait()
