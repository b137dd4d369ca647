"""One turn of the job supervisor's loop (gpusched/proc/supervisor/main.py) records the ends it saw
before it starts the jobs asked for: an end's report is what sets off the daemon's next
pass, which starts the next job, so it goes out before the supervisor spends its time on
spawns.

The supervisor runs in this process (its real loop, real jobs, real sockets), one turn at
a time; the test plays the daemon on the supervisor's socket and on a wake socket.
"""

from __future__ import annotations

import json
import os
import select
import socket

import pytest

from conftest import wait_until
from gpusched.proc import jobenv, runfile
from gpusched.proc.supervisor import main as supervisor

pytestmark = pytest.mark.e2e


def _spec(tmp_path, job_id: int, wake: str) -> bytes:
    run = f"{job_id}.1.0.0"
    spec = {
        "job_id": job_id,
        "run": run,
        "run_file": runfile.run_file(str(tmp_path), job_id),
        "command": ["true"],
        "env": {"PATH": os.defpath, jobenv.RUN_TOKEN: run},
        "cwd": str(tmp_path),
        "stdout": str(tmp_path / f"{job_id}.out"),
        "stderr": str(tmp_path / f"{job_id}.err"),
        "grace_s": 1.0,
        "wake": wake,
        "cpu_ids": [],
        "cgroup": "",
        "run_as": None,
    }
    return (json.dumps(spec) + "\n").encode()


def _one_turn(sup: supervisor.Supervisor) -> None:
    turns = iter([False, True])
    sup._done = lambda: next(turns)
    sup.serve()


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def test_a_turn_records_the_ends_it_saw_before_it_starts_jobs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the spawn enters the job's directory, then "/"
    wake = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    wake.bind(str(tmp_path / "wake.sock"))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "sup.sock"))
    listener.listen(4)
    daemon = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    daemon.connect(str(tmp_path / "sup.sock"))
    sup = supervisor.Supervisor(listener)
    try:
        _one_turn(sup)  # takes the daemon's connection
        assert daemon.recv(64).startswith(supervisor.HELLO)
        daemon.sendall(_spec(tmp_path, 1, str(tmp_path / "wake.sock")))
        wait_until(lambda: _readable(next(iter(sup.links))), "the first job's request")
        _one_turn(sup)
        (first,) = sup.jobs
        wait_until(lambda: _readable(first), "the first job's end")

        order = []
        end, launch = sup._end, sup._launch
        sup._end = lambda jobs: (order.append(("end", [j.pid for j in jobs])), end(jobs))
        sup._launch = lambda spec, line: (
            order.append(("start", spec["job_id"])),
            launch(spec, line),
        )
        daemon.sendall(_spec(tmp_path, 2, str(tmp_path / "wake.sock")))
        wait_until(lambda: _readable(next(iter(sup.links))), "the second job's request")
        _one_turn(sup)  # both the end and the request are there for this turn
        assert [kind for kind, _ in order] == ["end", "start"]
        wake.settimeout(5)
        assert wake.recv(64) == runfile.WAKE  # the first job's end, reported

        sup._end = end
        wait_until(lambda: _readable(next(iter(sup.jobs))), "the second job's end")
        _one_turn(sup)
        assert not sup.by_pid  # both recorded and reaped
        assert runfile.read_run(str(tmp_path), 2).exit.exit_code == 0
    finally:
        for report in sup.ends.reports.values():
            report[0].close()
        sup.poll.close()
        daemon.close()
        wake.close()
        listener.close()
