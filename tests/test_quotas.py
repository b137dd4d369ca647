"""What one user can make the daemon hold, bounded: jobs and their stored bytes per user
(`[limits] queued_jobs` and `queued_bytes`, through the real CLI and a real daemon, and the
table that counts them), large frames read at once, and /metrics connections."""

from __future__ import annotations

import json
import socket
import sqlite3
import threading

from conftest import Home, wait_until
from gpusched.client import protocol
from gpusched.core.config import Settings
from gpusched.core.errors import GpuschedError
from gpusched.core.models import Job
from gpusched.daemon.jobs.jobtable import Kinds
from gpusched.daemon.requests.framebudget import FrameBudget
from gpusched.daemon.requests.quotas import CountedTable, Reservation, job_bytes
from gpusched.daemon.requests.server import SocketServer
from test_limits import one_error_line


def held_ids(home: Home) -> list[int]:
    return [job["id"] for job in home.jobs() if job["state"] == "pending"]


def test_a_submit_over_queued_jobs_is_refused_whole_and_cancelling_frees_the_quota(home):
    home.write_config("[limits]\nqueued_jobs = 5\n")
    home.start()
    first = home.json("submit", "--hold", "--array", "0-2", "--", "true")["array_id"]
    before = home.jobs()
    err = one_error_line(
        home.run("submit", "--hold", "--array", "0-2", "--", "true", check=False),
        1,
        "has 3 jobs queued",
        "adds 3",
        "limit of 5",
        "limits.queued_jobs",
        "gpusched cancel",
    )
    assert "nothing was queued" in err
    # Nor a --from-file sweep, whose lines stream after the request.
    one_error_line(
        home.run("submit", "--hold", "--from-file", "-", input="true\ntrue\ntrue\n", check=False),
        1,
        "limits.queued_jobs",
    )
    assert home.jobs() == before  # the earlier jobs untouched, nothing of the others queued
    home.run("cancel", str(first))  # the whole array
    assert home.json("submit", "--hold", "--array", "0-4", "--", "true")
    # Counted again after a restart, from the jobs the daemon loads.
    home.run("daemon", "stop")
    home.start()
    one_error_line(
        home.run("submit", "--hold", "--", "true", check=False),
        1,
        "has 5 jobs queued",
        "limits.queued_jobs",
    )
    # Nor does a cancelled job come back past it.
    again = home.run("requeue", str(first), check=False)
    assert again.returncode == 1 and "limits.queued_jobs" in again.stderr, again


def test_a_submit_over_queued_bytes_is_refused_and_an_ended_job_frees_it(home):
    home.write_config('[limits]\nqueued_bytes = "200KiB"\n')
    home.start()
    env = {"BIG": "v" * 120_000}
    held = json.loads(home.run("submit", "--json", "--hold", "--", "true", env=env).stdout)["id"]
    one_error_line(
        home.run("submit", "--hold", "--", "true", check=False, env=env),
        1,
        "bytes queued",
        "limit of 204,800",
        "limits.queued_bytes",
    )
    assert held_ids(home) == [held]
    home.run("release", str(held))
    home.wait_state(held, "succeeded")
    # Its bytes went with it: the same submit is taken now.
    home.run("submit", "--hold", "--", "true", env=env)


def test_the_table_counts_each_users_jobs_as_they_come_and_go():
    table = CountedTable(Kinds(lambda user, job_id: (f"/l/{job_id}.out", f"/l/{job_id}.err")))
    env = {"A": "b"}

    def job(job_id: int, uid: int) -> Job:
        return Job(
            id=job_id,
            command=("echo", "hi"),
            cwd="/w",
            uid=uid,
            user=f"u{uid}",
            env=env,
            stdout_path=f"/l/{job_id}.out",
            stderr_path=f"/l/{job_id}.err",
        )

    for job_id in range(1, 4):
        table[job_id] = job(job_id, 1000)
    table[4] = job(4, 1001)
    table[2] = job(2, 1000)  # a change, not another job
    size = job_bytes(job(1, 1000))
    assert size == len("echohi") + len("A=b") + len("/w")
    assert table.used(1000) == (3, 3 * size) and table.used(1001) == (1, size)
    table.discard(1)
    table.pop(2)
    del table[4]
    assert table.used(1000) == (1, size) and table.used(1001) == (0, 0)
    # A submit still being stored counts until the table holds its jobs.
    table.reserved.append(Reservation(1000, 10, 10 * size))
    settings = Settings(limit_queued_jobs=11)
    table.check(1000, "u1000", 0, 0, settings)
    try:
        table.check(1000, "u1000", 1, size, settings)
    except GpuschedError as exc:
        assert "has 11 jobs queued" in exc.message
    else:
        raise AssertionError("over the quota, yet taken")


def _ask(path: str, message: dict) -> dict:
    """The reply to one request on a new connection; a refused one's reply may come
    before all of the request is sent (then sending fails, and the reply is still read)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(path)
        try:
            protocol.send(sock, message)
        except BrokenPipeError:
            pass
        return protocol.receive(sock) or {"ok": False}


def test_large_frames_read_at_once_are_bounded_over_all_connections(tmp_path):
    release, entered = threading.Event(), []

    def dispatch(name, args, creds):
        if name == "submit":
            entered.append(name)
            release.wait(60)
        return {"answered": name}

    path = str(tmp_path / "s.sock")
    server = SocketServer(path, dispatch, frames=FrameBudget(3 * 2**20, wait_s=0.2))
    server.start()
    big = {"cmd": "submit", "args": {"jobs": [{"command": ["x" * 2 * 2**20]}], "cwd": "/"}}
    try:
        first: list[dict] = []
        sender = threading.Thread(target=lambda: first.append(_ask(path, big)))
        sender.start()
        wait_until(lambda: entered, "the first large request to be handled")
        # Held while it is handled: a second would take the daemon over its budget.
        refused = _ask(path, big)
        assert refused["ok"] is False and "try again" in refused["error"]["message"]
        assert _ask(path, {"cmd": "status", "args": {}})["ok"]  # small ones pass
        release.set()
        sender.join(60)
        assert first[0]["ok"]
        assert _ask(path, big)["ok"]  # given back once answered
        wait_until(lambda: server._frames.used_bytes == 0, "the budget to be given back")
    finally:
        release.set()
        server.close()
        server.drain()


def test_a_submit_being_stored_in_batches_counts_against_the_quota(home):
    home.write_config("[limits]\nqueued_jobs = 50000\n")
    home.start()
    done: list = []
    big = threading.Thread(
        target=lambda: done.append(
            home.run("submit", "--hold", "--array", "0-49999", "--", "true", check=False)
        )
    )
    big.start()
    # Stored a batch per turn over seconds, its rows marked incomplete until the last.
    db = home.state / "queue.db"

    def storing() -> bool:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as conn:
            return bool(conn.execute("SELECT 1 FROM meta WHERE key LIKE 'incomplete%'").fetchall())

    wait_until(lambda: storing() or done, "the big submit to be stored")
    small = home.run("submit", "--hold", "--", "true", check=False)
    big.join(120)
    assert done[0].returncode == 0, done[0].stderr
    one_error_line(small, 1, "has 50,000 jobs queued", "limits.queued_jobs")
    status = json.loads(home.run("daemon", "status", "--json").stdout)
    assert status["pending"] == 50000
