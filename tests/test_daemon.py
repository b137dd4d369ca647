"""The daemon end to end: real processes, real SQLite, real sockets, simulated GPUs.

Its decisions (placement, cancel, re-adoption) are tested in process in test_inproc_queue.py
and test_inproc_runs.py; here, what only real processes show.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import Home, find_shim, is_gone, wait_until
from gpusched import __version__
from gpusched.client.connection import Client
from gpusched.client.paths import resolve_paths
from gpusched.proc import runfile

pytestmark = pytest.mark.e2e

GiB = 2**30


def gate(path: Path) -> str:
    """Shell that blocks until `path` exists: the test decides when a job may end."""
    return f"while [ ! -e {shlex.quote(str(path))} ]; do sleep 0.05; done"


def release(*paths: Path) -> None:
    for path in paths:
        path.touch()


class Api:
    """Looks at a home's daemon through the client library, in this process.

    The behaviour under test goes through the real CLI; polling does not need a Python
    start-up per look, which on a loaded 2-core machine is most of a second.
    """

    def __init__(self, home):
        self.client = Client(resolve_paths(home.env), autostart=False)

    def show(self, job_id: int) -> dict:
        return self.client.call("show", ids=[job_id])["jobs"][0]

    def jobs(self) -> list[dict]:
        return self.client.call("list", all=True)["jobs"]

    def gpus(self) -> list[dict]:
        return self.client.call("gpus")["gpus"]

    def wait_state(self, job_id: int, *states: str) -> dict:
        return wait_until(
            lambda: (j := self.show(job_id))["state"] in states and j,
            f"job {job_id} to reach {states}",
        )


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.stderr.startswith("Error: "), proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.endswith("\n"), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    return proc.stderr


# -- placement on real daemons -------------------------------------------------------------
def declare_outside(home, memory: str) -> None:
    home.state.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = home.state / "simulated_processes.toml"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        '[[process]]\ngpu = 0\npid = 4242\nuser = "alice"\n'
        f'memory = "{memory}"\nutil = 5\ncommand = "python notebook.py"\n'
    )
    tmp.rename(path)  # the backend re-reads it: never let it see half a file


def test_an_outside_process_keeps_a_job_off_its_gpu(make_home):
    home = make_home("1x80GiB")
    api = Api(home)
    # Outside processes count at their peak over a window: 2 s here, so that the dip below
    # is believed soon (tests/test_gpuover.py has the window's own tests).
    home.write_config('[daemon]\ngpu_poll_interval = "0.2s"\n[memory]\nothers_peak_window = "2s"\n')
    declare_outside(home, "70GiB")
    job_id = home.submit("--gpu-mem", "20G", "--", "true")
    job = wait_until(
        lambda: (j := api.show(job_id))["pending_reason"].startswith("needs") and j,
        "the job to be considered",
    )
    assert job["state"] == "pending"
    assert job["pending_reason"] == (
        "needs 1 GPU with 20.0 GiB free; most free is GPU 0 with 10.0 GiB"
    )
    (gpu,) = api.gpus()
    assert gpu["mem_used_bytes"] == 70 * GiB and gpu["jobs"] == []
    assert [(p["pid"], p["user"], p["job"]) for p in gpu["processes"]] == [(4242, "alice", None)]
    # The notebook lets go of 20 GiB: 30 GiB are free, enough for 20 GiB plus headroom, once
    # its peak of 70 GiB has left the window.
    declare_outside(home, "50GiB")
    job = api.wait_state(job_id, "succeeded")
    assert job["gpu_indices"] == [0]


# -- crash safety --------------------------------------------------------------------------
def test_jobs_survive_a_killed_daemon_and_gpus_stay_reserved(make_home, tmp_path):
    """Jobs outlive a daemon killed with SIGKILL: one that ends meanwhile leaves its exit
    record for the next daemon, which re-adopts the one still running, keeps its GPU, and
    learns from its shim how it died (every case of re-adoption is in test_inproc_runs.py)."""
    home = make_home("2x80GiB")
    api = Api(home)
    ends = {"ok": "exit 0", "killed": "kill -9 $$"}
    gates = {name: tmp_path / f"go-{name}" for name in ends}
    pids = {name: tmp_path / f"pid-{name}" for name in ends}
    ids = {
        name: home.submit(
            "--gpus", "1", "--", "sh", "-c", f"echo $$ > {pids[name]}; {gate(gates[name])}; {end}"
        )
        for name, end in ends.items()
    }
    for job_id in ids.values():
        api.wait_state(job_id, "running")
    before = {name: api.show(job_id)["gpus"] for name, job_id in ids.items()}
    assert len({g for gpus in before.values() for g in gpus}) == 2
    wait_until(
        lambda: all(p.exists() and p.read_text().strip() for p in pids.values()),
        "the jobs to write their pids",
    )
    old_pid = home.daemon_pid()

    home.kill_daemon()
    # One job ends while no daemon runs: its shim keeps the exit record for the next one.
    release(gates["ok"])
    ok_pid = int(pids["ok"].read_text())
    wait_until(lambda: is_gone(ok_pid), "the first job to end")
    assert psutil.pid_exists(int(pids["killed"].read_text())), "the job died with the daemon"

    assert home.start() != old_pid
    ok = api.wait_state(ids["ok"], "succeeded", "failed", "lost")
    assert (ok["state"], ok["exit_code"], ok["signal"]) == ("succeeded", 0, None)
    job = api.show(ids["killed"])
    assert job["state"] == "running" and job["gpus"] == before["killed"]
    gpus = {g["uuid"]: g for g in home.json("gpus")["gpus"]}
    assert gpus[before["killed"][0]]["jobs"] == [ids["killed"]]
    assert gpus[before["ok"][0]]["jobs"] == []

    release(gates["killed"])
    killed = api.wait_state(ids["killed"], "succeeded", "failed", "lost")
    assert (killed["state"], killed["exit_code"], killed["signal"]) == ("failed", None, 9)


def corrupt(home) -> None:
    home.state.mkdir(mode=0o700, parents=True)
    (home.state / "queue.db").write_bytes(b"definitely not SQLite\n" * 500)


def newer(home) -> None:
    home.run("submit", "--", "true")  # a real queue, left by a newer gpusched below
    home.run("daemon", "stop")
    with sqlite3.connect(home.state / "queue.db") as conn:
        conn.execute("PRAGMA user_version = 999")
    conn.close()


def file_state(home) -> dict[str, str | None]:
    out = {}
    for suffix in ("", "-wal", "-shm"):
        path = home.state / f"queue.db{suffix}"
        out[suffix] = hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None
    return out


@pytest.mark.parametrize(
    "spoil, words, commands",
    [
        (corrupt, "is corrupt", [("daemon", "run"), ("daemon", "start"), ("ls",)]),
        (newer, "schema version 999", [("daemon", "start")]),
    ],
)
def test_a_bad_queue_file_is_refused_and_left_alone(home, spoil, words, commands):
    spoil(home)
    before = file_state(home)
    assert before[""] is not None
    for args in commands:
        proc = home.run(*args, check=False, timeout=60)
        assert proc.returncode == 1, (args, proc.stderr)
        line = one_error_line(proc)
        assert words in line and str(home.state / "queue.db") in line
    assert file_state(home) == before
    assert home.run("daemon", "status", check=False).returncode == 3


# -- the loop is event driven --------------------------------------------------------------
def test_jobs_start_at_once_not_at_the_next_gpu_poll(make_home, tmp_path):
    home = make_home("1x80GiB")
    api = Api(home)
    home.write_config('[daemon]\ngpu_poll_interval = "30s"\n')
    home.start()
    first = home.submit("--gpus", "1", "--", "sh", "-c", gate(tmp_path / "go"))
    job = api.wait_state(first, "running")
    # A behaviour check, not a benchmark: far below the 30 s poll, generous for slow CI.
    assert job["started_at"] - job["submitted_at"] < 5
    second = home.submit("--gpus", "1", "--", "true")
    assert api.show(second)["state"] == "pending"
    release(tmp_path / "go")
    ended = api.wait_state(first, "succeeded")
    started = api.wait_state(second, "running", "succeeded")
    assert started["started_at"] - ended["ended_at"] < 5


# -- stop, restart, cancel -----------------------------------------------------------------
def test_daemon_stop_leaves_jobs_running_and_the_next_start_adopts_them(make_home, tmp_path):
    """`gpusched daemon stop` leaves a running job's process alone; the next daemon adopts
    it and records its real exit status (what adoption keeps is in test_inproc_runs.py)."""
    home = make_home("1x80GiB")
    api = Api(home)
    pid_file = tmp_path / "pid"
    job_id = home.submit(
        "--gpus", "1", "--", "sh", "-c", f"echo $$ > {pid_file}; {gate(tmp_path / 'go')}; exit 4"
    )
    job = api.wait_state(job_id, "running")
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), "the job's pid")
    stopped = home.run("daemon", "stop")
    assert "1 running job(s) left running" in stopped.stdout
    assert home.run("daemon", "status", check=False).returncode == 3
    job_pid = int(pid_file.read_text())
    assert psutil.pid_exists(job_pid)
    home.start()
    adopted = api.show(job_id)
    assert adopted["state"] == "running" and adopted["gpus"] == job["gpus"]
    assert adopted["started_at"] == job["started_at"]
    release(tmp_path / "go")
    done = api.wait_state(job_id, "failed", "succeeded", "lost")
    assert (done["state"], done["exit_code"]) == ("failed", 4)


def test_a_job_whose_shim_is_killed_is_lost_and_its_gpu_freed(make_home, tmp_path):
    """A shim killed for real is found dead by its pid and start time at the next poll
    (what follows from a lost job is in test_inproc_runs.py)."""
    home = make_home("1x80GiB")
    api = Api(home)
    home.write_config('[daemon]\ngpu_poll_interval = "1s"\n')  # liveness is checked each poll
    home.start()
    job_id = home.submit("--gpus", "1", "--", "sh", "-c", gate(tmp_path / "never"))
    api.wait_state(job_id, "running")
    pid, _ = wait_until(lambda: find_shim(home.state / "jobs", job_id), "the shim's pid")
    if runfile.read_run(home.state / "jobs", job_id).shim.supervised:
        pid = psutil.Process(pid).ppid()  # no shim of its own: what watches it, the supervisor
    os.kill(pid, signal.SIGKILL)
    lost = api.wait_state(job_id, "lost", "failed", "succeeded")
    assert lost["state"] == "lost" and "vanished" in lost["end_reason"]
    assert [g["jobs"] for g in api.gpus()] == [[]]


def test_jobs_cancelled_the_moment_they_start_end_cancelled(make_home, tmp_path):
    """A cancel may come before the launcher has forked the shim (its pid not yet known):
    it is passed on once the shim is there, and the job does not run on."""
    home = make_home("4x80GiB")
    api = Api(home)
    ids = [home.submit("--gpus", "1", "--", "sh", "-c", gate(tmp_path / "never")) for _ in range(4)]
    for job_id in ids:
        api.wait_state(job_id, "running")
    home.run("cancel", *map(str, ids))
    for job_id in ids:
        assert (
            api.wait_state(job_id, "cancelled", "failed", "succeeded", "lost")["state"]
            == "cancelled"
        )


def test_cancel_pending_and_running_jobs(make_home, tmp_path):
    """`gpusched cancel` of a pending job and of a running one that ignores SIGTERM: the
    pending one never runs; the running one gets SIGTERM, then SIGKILL once the grace is
    over (each outcome and its end reason are in test_inproc_runs.py)."""
    home = make_home("1x80GiB")
    api = Api(home)
    home.write_config('[daemon]\ncancel_grace = "1s"\n')
    ready, log = tmp_path / "ready", tmp_path / "term.log"
    stubborn = home.submit(
        "--gpus",
        "1",
        "--",
        "sh",
        "-c",
        f"trap 'echo TERM >> {log}' TERM; touch {ready}; while true; do sleep 0.05; done",
    )
    waiting = home.submit("--gpus", "1", "--", "sh", "-c", f"touch {tmp_path / 'waiting-ran'}")
    api.wait_state(stubborn, "running")
    wait_until(ready.exists, "the stubborn job to trap SIGTERM")
    assert api.show(waiting)["state"] == "pending"

    asked = time.time()
    out = home.run("cancel", str(stubborn), str(waiting)).stdout
    assert out == f"job {stubborn}: cancelling\njob {waiting}: cancelled\n"
    job = api.wait_state(stubborn, "cancelled", "failed", "succeeded")
    # It ignored SIGTERM (and said so), so it got SIGKILL once the grace period was over.
    assert (job["state"], job["signal"]) == ("cancelled", signal.SIGKILL)
    assert "TERM" in log.read_text()
    assert job["ended_at"] - asked >= 0.9
    job = api.show(waiting)
    assert (job["state"], job["started_at"]) == ("cancelled", None)
    assert not (tmp_path / "waiting-ran").exists()
    assert all(g["jobs"] == [] for g in api.gpus())


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One daemon for the tests whose jobs need no GPU: they cannot disturb each other."""
    home = Home(tmp_path_factory.mktemp("daemon") / "home")
    home.path.mkdir()
    home.start()
    yield home
    home.cleanup()


def test_a_second_daemon_refuses_to_start(shared):
    home, pid = shared, shared.daemon_pid()
    proc = home.run("daemon", "run", check=False, timeout=60)
    assert proc.returncode == 1
    assert "already runs" in one_error_line(proc)
    again = home.run("daemon", "start")
    assert f"already running (pid {pid})" in again.stdout
    assert home.daemon_pid() == pid
    assert home.submit("--", "true")  # and the first one still serves


# -- waiting and exit statuses -------------------------------------------------------------
def test_wait_exits_with_the_first_non_zero_status(shared):
    home, api = shared, Api(shared)
    ok, three, five, killed = home.run(
        "submit", "-f", "-", input="true\nexit 3\nexit 5\nkill -9 $$\n"
    ).stdout.split()
    assert home.run("wait", str(ok)).returncode == 0
    assert home.run("wait", str(ok), str(three), str(five), check=False).returncode == 3
    assert home.run("wait", str(five), str(three), check=False).returncode == 5
    assert home.run("wait", str(killed), check=False).returncode == 128 + 9
    assert api.show(int(three))["state"] == "failed"


def test_submit_wait_exits_with_the_jobs_status(shared):
    home, api = shared, Api(shared)
    proc = home.run("submit", "--wait", "--", "sh", "-c", "sleep 0.2; exit 7", check=False)
    assert proc.returncode == 7
    job_id = int(proc.stdout.strip())
    job = api.show(job_id)
    assert (job["state"], job["exit_code"]) == ("failed", 7)
    assert home.run("submit", "--wait", "--", "true").returncode == 0


# -- submitting many -----------------------------------------------------------------------
def check_sweep(api: Api, ids: list[int], lines: list[str]) -> None:
    jobs = [api.show(i) for i in ids]
    assert [j["command"] for j in jobs] == [["/bin/sh", "-c", line] for line in lines]
    # One request: the daemon stamped every job with the same time and submitting pid.
    assert len({j["submitted_at"] for j in jobs}) == 1
    assert len({j["submit_pid"] for j in jobs}) == 1
    assert ids == list(range(ids[0], ids[0] + len(ids)))


def test_submit_from_file_and_stdin(shared, tmp_path):
    home, api = shared, Api(shared)
    sweep = tmp_path / "sweep.txt"
    sweep.write_text("# a sweep\n\necho one\n   echo two   \n# echo skipped\necho three\n")
    ids = home.json("submit", "--from-file", str(sweep))["ids"]
    assert len(ids) == 3
    check_sweep(api, ids, ["echo one", "echo two", "echo three"])
    for job_id, word in zip(ids, ["one", "two", "three"]):
        api.wait_state(job_id, "succeeded")
        assert home.run("logs", str(job_id)).stdout == f"{word}\n"

    proc = home.run("submit", "-f", "-", input="echo a\n#c\necho b\n")
    stdin_ids = [int(line) for line in proc.stdout.split()]
    assert len(stdin_ids) == 2
    check_sweep(api, stdin_ids, ["echo a", "echo b"])


# -- logs ----------------------------------------------------------------------------------
def read_line(proc: subprocess.Popen, timeout: float = 60) -> bytes:
    """One line of a child's stdout, or fail after `timeout` s (never hang the suite)."""
    line = b""
    deadline = time.monotonic() + timeout
    while not line.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([proc.stdout], [], [], remaining)[0]:
            pytest.fail(f"no line from {proc.args} within {timeout} s (got {line!r})")
        chunk = os.read(proc.stdout.fileno(), 1)
        if not chunk:
            break
        line += chunk
    return line


def test_logs_stdout_stderr_and_follow(shared, tmp_path):
    home, api = shared, Api(shared)
    job_id = home.submit(
        "--", "sh", "-c", f"echo out1; echo err1 >&2; {gate(tmp_path / 'go')}; echo out2"
    )
    api.wait_state(job_id, "running")
    wait_until(lambda: home.run("logs", str(job_id)).stdout == "out1\n", "the first line")
    assert home.run("logs", "--stderr", str(job_id)).stdout == "err1\n"
    follow = subprocess.Popen(
        [sys.executable, "-m", "gpusched", "logs", "-f", str(job_id)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=home.env,
    )
    try:
        assert read_line(follow) == b"out1\n"
        assert follow.poll() is None  # still following a running job
        release(tmp_path / "go")
        rest, err = follow.communicate(timeout=60)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    assert follow.returncode == 0, err
    assert rest == b"out2\n"
    assert api.show(job_id)["state"] == "succeeded"


# -- auto-start and status -----------------------------------------------------------------
def daemon_status(home) -> dict:
    return json.loads(home.run("daemon", "status", "--json").stdout)


def test_any_client_command_starts_the_daemon_and_status_reports_it(make_home):
    home = make_home("2xH100-80GiB,2xA100-40GiB")
    proc = home.run("daemon", "status", "--json", check=False)
    assert proc.returncode == 3 and json.loads(proc.stdout)["running"] is False
    gpus = home.json("gpus")  # starts the daemon
    assert gpus["backend"] == "simulated"
    assert [g["name"] for g in gpus["gpus"]] == [
        "NVIDIA H100",
        "NVIDIA H100",
        "NVIDIA A100",
        "NVIDIA A100",
    ]
    status = daemon_status(home)
    pid = status["pid"]
    assert status["running"] is True
    assert (status["running_jobs"], status["pending_jobs"]) == (0, 0)
    assert psutil.pid_exists(pid) and "daemon" in " ".join(psutil.Process(pid).cmdline())
    assert status["version"] == __version__
    assert status["backend"] == "simulated"
    assert status["gpu_count"] == 4
    assert 0 <= status["uptime_s"] < 600
    later = wait_until(
        lambda: (s := daemon_status(home))["uptime_s"] > status["uptime_s"] and s, "uptime to grow"
    )
    assert later["pid"] == pid
