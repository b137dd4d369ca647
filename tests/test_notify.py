"""[[notify]] hooks and webhooks as a user sees them: a real daemon in a temporary home,
real hook processes, a real HTTP server on a free local port."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from conftest import executable, is_gone, wait_until

# Relative paths: a shell run by the hook (cwd /) or by the job (cwd the home) would leave
# the file in one of those. No newline: --name refuses control characters.
HOSTILE_NAME = "x'; touch PWNED1; echo '$(touch PWNED2) \"`touch PWNED3`\""

RECORDER = """#!/bin/sh
# Keeps what a hook gets: its environment and its stdin, one pair per event.
out="$1"
env > "$out/env-$GPUSCHED_EVENT"
cat > "$out/stdin-$GPUSCHED_EVENT"
"""


def notify_log(home) -> str:
    path = home.state / "notify.log"
    return path.read_text() if path.exists() else ""


def test_a_hook_gets_the_job_as_env_and_json_and_never_runs_its_name(home, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    hook = executable(tmp_path / "record.sh", RECORDER)
    home.write_config(
        f'[[notify]]\nevents = ["start", "end", "fail"]\n'
        f'command = ["{hook}", "{out}"]\nlog_lines = 5\n'
    )
    name = HOSTILE_NAME
    job = home.submit(
        "--name",
        name,
        "--",
        "sh",
        "-c",
        "echo one; echo two; echo Traceback >&2; echo boom >&2; exit 3",
        "$(touch PWNED4)",
    )
    home.wait_state(job, "failed")
    wait_until(
        lambda: (out / "stdin-fail").exists() and notify_log(home).count("\n") >= 3,
        "the three hook runs",
    )
    event = json.loads((out / "stdin-fail").read_text())
    assert event["event"] == "fail" and event["job"]["id"] == job
    assert event["job"]["name"] == name and event["job"]["exit_code"] == 3
    assert event["log_tail"][-2:] == ["one", "two"]
    assert event["err_tail"][-2:] == ["Traceback", "boom"]  # the failure's own words
    env = (out / "env-fail").read_text()
    assert f"GPUSCHED_JOB_ID={job}\n" in env and "GPUSCHED_JOB_STATE=failed\n" in env
    assert "GPUSCHED_JOB_EXIT_CODE=3\n" in env and "GPUSCHED_EVENT=fail\n" in env
    assert {p.name for p in out.iterdir()} == {
        f"{k}-{e}" for k in ("env", "stdin") for e in ("start", "end", "fail")
    }
    executed = [*tmp_path.rglob("PWNED*"), *Path("/").glob("PWNED*")]
    assert not executed, "a job's name or command was executed"
    assert f"job {job} fail -> {hook}: exit 0" in notify_log(home)


def test_a_slow_hook_blocks_nothing_and_its_timeout_kills_its_group(home, tmp_path):
    pids = tmp_path / "pids"
    hook = executable(tmp_path / "slow.sh", f"#!/bin/sh\nsleep 300 &\necho $! >> {pids}\nwait\n")
    home.write_config(f'[[notify]]\nevents = ["end"]\ncommand = ["{hook}"]\ntimeout = "20s"\n')
    first = home.submit("--", "true")
    home.wait_state(first, "succeeded")
    sleeper = int(
        wait_until(
            lambda: pids.exists() and pids.read_text().strip(), "the hook's background sleep"
        )
    )
    # While the hook runs, the daemon answers and starts and ends other jobs.
    second = home.submit("--", "true")
    home.wait_state(second, "succeeded")
    assert not is_gone(sleeper), "the hook ended before the second job: the test proves nothing"
    wait_until(
        lambda: f"job {first} end -> {hook}: timeout after 20 s" in notify_log(home),
        "the hook's timeout",
        timeout=90,
    )
    wait_until(lambda: is_gone(sleeper), "the hook's whole process group to be killed")


class Receiver(BaseHTTPRequestHandler):
    """A chat webhook that fails with 503 first, then takes the posts."""

    statuses: ClassVar[list[int]] = []
    bodies: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        type(self).bodies.append(json.loads(self.rfile.read(length)))
        status = type(self).statuses.pop(0) if type(self).statuses else 200
        self.send_response(status)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def receiver():
    handler = type("R", (Receiver,), {"statuses": [503], "bodies": []})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, handler
    server.shutdown()
    server.server_close()


def test_a_webhook_gets_escaped_text_and_is_retried_after_a_503(home, receiver):
    server, handler = receiver
    url = f"http://127.0.0.1:{server.server_port}/hooks/secret-token"
    home.write_config(f'[[notify]]\nevents = ["fail"]\nurl = "{url}"\ntimeout = "10s"\n')
    job = home.submit("--name", "<!channel> & co", "--", "false")
    home.wait_state(job, "failed")
    wait_until(lambda: len(handler.bodies) == 2, "the post and its retry")
    body = handler.bodies[-1]
    assert body["event"] == "fail" and body["job"]["id"] == job
    assert "&lt;!channel&gt; &amp; co" in body["text"] and "<!channel>" not in body["text"]
    log = wait_until(lambda: "HTTP 200" in notify_log(home) and notify_log(home), "the log")
    assert (
        f"job {job} fail -> http://127.0.0.1:{server.server_port}/…: HTTP 200 after 2 tries" in log
    )
    assert "secret-token" not in log


def test_a_webhook_answering_404_is_not_retried(home, receiver):
    server, handler = receiver
    handler.statuses[:] = [404]
    home.write_config(
        f'[[notify]]\nevents = ["end"]\nurl = "http://127.0.0.1:{server.server_port}/gone"\n'
    )
    job = home.submit("--", "true")
    home.wait_state(job, "succeeded")
    wait_until(lambda: "given up" in notify_log(home), "the post to be given up")
    assert "HTTP 404 after 1 try, given up" in notify_log(home) and len(handler.bodies) == 1


def test_a_shell_string_command_is_refused_with_the_argv_form(home):
    home.write_config('[[notify]]\nevents = ["end"]\ncommand = "notify-send done"\n')
    proc = home.run("daemon", "start", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "write it as an argv list, e.g. ['notify-send', 'done']" in proc.stderr


def test_a_job_pending_too_long_is_told_once(make_home, tmp_path):
    home = make_home("1x80GiB")
    out = tmp_path / "out"
    out.mkdir()
    hook = executable(tmp_path / "record.sh", RECORDER)
    gate = tmp_path / "gate"
    home.write_config(
        f'[[notify]]\nevents = ["pending_longer_than"]\n'
        f'pending_longer_than = "1s"\ncommand = ["{hook}", "{out}"]\n'
    )
    blocker = home.submit(
        "--gpus", "1", "--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.1; done"
    )
    waiting = home.submit("--gpus", "1", "--", "true")
    wait_until(
        lambda: f"job {waiting} pending_longer_than" in notify_log(home),
        "the pending job's notification",
    )
    event = json.loads((out / "stdin-pending_longer_than").read_text())
    assert event["job"]["id"] == waiting and event["job"]["state"] == "pending"
    gate.touch()
    home.wait_state(waiting, "succeeded")
    assert notify_log(home).count("pending_longer_than") == 1
    assert f"job {blocker} " not in notify_log(home)


def peak_rss_bytes(pid: int) -> int:
    """The process's peak resident memory (VmHWM): a high-water mark, not a sample."""
    line = next(
        x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmHWM:")
    )
    return int(line.split()[1]) * 1024


def test_a_hook_that_prints_a_gigabyte_costs_the_daemon_no_memory(home):
    home.write_config(
        '[[notify]]\nevents = ["end"]\ncommand = ["sh", "-c", "head -c 1G '
        '/dev/zero; echo; echo printed it all; exit 4"]\n'
    )
    daemon = home.start()
    before = peak_rss_bytes(daemon)
    job = home.submit("--", "true")
    home.wait_state(job, "succeeded")
    wait_until(
        lambda: f"job {job} end -> sh: exit 4 printed it all" in notify_log(home),
        "the hook's end, with the last line it printed",
        timeout=120,
    )
    grown = peak_rss_bytes(daemon) - before
    assert grown < 64 * 1024 * 1024, f"the daemon's peak memory grew by {grown} bytes"


class Dripping(threading.Thread):
    """A webhook that takes the post and answers one header line a second,
    forever: each read comes within any per-read timeout. Counts the posts cut off."""

    def __init__(self):
        super().__init__(daemon=True)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.posts = self.cut_off = 0
        self.lock = threading.Lock()

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return  # closed by the test
            threading.Thread(target=self.drip, args=(conn,), daemon=True).start()

    def drip(self, conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            with self.lock:
                self.posts += 1
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                while True:
                    time.sleep(1.0)
                    conn.sendall(b"X-Drip: 1\r\n")
            except OSError:
                with self.lock:
                    self.cut_off += 1


@pytest.fixture
def dripping():
    server = Dripping()
    server.start()
    yield server
    server.server.close()


def test_a_dripping_webhook_is_cut_off_and_later_notifications_still_go_out(
    home, dripping, tmp_path
):
    out = tmp_path / "out"
    out.mkdir()
    hook = executable(tmp_path / "mark.sh", '#!/bin/sh\ntouch "$1/$GPUSCHED_JOB_ID"\n')
    home.write_config(
        f'[[notify]]\nevents = ["end"]\nurl = "http://127.0.0.1:{dripping.port}/x"'
        '\ntimeout = "2s"\nretries = 0\n\n'
        f'[[notify]]\nevents = ["end"]\ncommand = ["{hook}", "{out}"]\n'
    )
    jobs = [home.submit("--", "true") for _ in range(6)]  # more posts than threads
    for job in jobs:
        home.wait_state(job, "succeeded")
    wait_until(
        lambda: all((out / str(job)).exists() for job in jobs),
        "every job's hook, after the dripping posts",
    )
    wait_until(
        lambda: notify_log(home).count("(cut off) after 1 try, given up") == len(jobs),
        "every post to be cut off at its deadline",
    )
    wait_until(
        lambda: dripping.cut_off == dripping.posts == len(jobs),
        "the server to see each connection closed",
    )
