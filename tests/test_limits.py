"""Limits on every request, paged listings and waits that cannot lock a user out (issue 14:
points 3, 9 and 11), through the real CLI and a real daemon, or its real socket server."""

from __future__ import annotations

import re
import socket
import struct
import threading
from pathlib import Path

import pytest

from conftest import REPO, Home, wait_until
from gpusched.client import protocol
from gpusched.client.connection import Client
from gpusched.client.paths import resolve_paths
from gpusched.core.errors import ProtocolError, UsageError
from gpusched.core.spec import limits
from gpusched.daemon.requests.server import SocketServer


def one_error_line(proc, status: int, *words: str) -> str:
    err = proc.stderr
    assert proc.returncode == status, (proc.returncode, proc.stdout, err)
    assert err.startswith("Error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err + proc.stdout
    for word in words:
        assert word in err, (word, err)
    return err


def raw_request(home: Home, body: bytes) -> dict:
    """One frame of exactly these bytes to the daemon, as a client of its own would send."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(resolve_paths(home.env).socket)
        sock.sendall(struct.pack(">I", len(body)) + body)
        return protocol.receive(sock)


def client(home: Home) -> Client:
    return Client(resolve_paths(home.env), autostart=False)


# -- sizes -------------------------------------------------------------------------------


def test_a_submit_over_a_limit_is_refused_in_one_line_naming_it(home):
    home.start()
    big = "x" * 100_000  # two arguments: one alone may be at most 128 KiB
    one_error_line(
        home.run("submit", "--", "echo", big, big, check=False),
        2,
        "200,004 bytes",
        "131,072",
        "limits.command",
    )
    one_error_line(
        home.run("submit", "--name", "n" * 300, "--", "true", check=False),
        2,
        "job name",
        "limits.name",
    )
    env = {f"BIG{i}": "v" * 100_000 for i in range(11)}
    one_error_line(
        home.run("submit", "--", "true", check=False, env=env), 2, "environment", "limits.env"
    )
    one_error_line(
        home.run("submit", "--array", "0-100000", "--", "true", check=False),
        2,
        "100,001 jobs",
        "limits.jobs",
    )
    assert home.json("ls", "--all") == []


def test_a_job_name_with_a_control_character_is_refused_in_one_line(home):
    # A newline in -J split the line of Slurm's job-completion log that named the job.
    home.start()
    for name in ("a\nb", "a\rb", "tab\there", "esc\x1b[31m", "del\x7f"):
        one_error_line(
            home.run("submit", "-J", name, "--", "true", check=False),
            2,
            "--name (-J) must not hold control characters",
            repr(name),
        )
    assert home.json("ls", "--all") == []
    job_id = home.json("submit", "-J", "fine name", "--", "true")["id"]
    one_error_line(
        home.run("resubmit", str(job_id), "--name", "x\ny", check=False), 2, "--name (-J)"
    )
    assert [j["id"] for j in home.json("ls", "--all")] == [job_id]


def test_a_submit_too_big_to_send_is_refused_naming_the_limit(home, monkeypatch):
    # exec() keeps a command line and environment far under a frame (16 MiB), so a
    # submit's request outgrows one only in process: the limit it is over is named, not
    # the frame's size, and nothing is queued.
    from gpusched.client.submit.fastsubmit import parse
    from gpusched.client.submit.submitting import submit_and_report

    home.start()
    for name in ("GPUSCHED_HOME", "GPUSCHED_SIMULATE"):
        monkeypatch.setenv(name, home.env[name])
    opts = parse(["--env", "BIG=" + "v" * 17 * 2**20, "--", "true"])
    with pytest.raises(UsageError, match=r"environment .* over the limit .*limits\.env"):
        submit_and_report(opts)
    assert home.json("ls", "--all") == []


def test_the_daemon_enforces_every_limit_when_the_client_is_bypassed(home):
    home.start()
    cli = client(home)
    base = {"command": ["true"], "name": "", "gpus": 0, "gpu_mem_bytes": None, "priority": 0}
    refusals = [
        ({"jobs": [base], "cwd": "/" + "d" * 9 * 2**20, "env": {}}, "limits.cwd"),
        ({"jobs": [{**base, "command": ["x" * 200_000]}], "cwd": "/", "env": {}}, "limits.command"),
        ({"jobs": [base], "cwd": "/", "env": {"A": "v" * (2**20)}}, "limits.env"),
        ({"jobs": [base] * 100_001, "cwd": "/", "env": {}}, "limits.jobs"),
    ]
    for args, key in refusals:
        with pytest.raises(UsageError, match=key.replace(".", r"\.")):
            cli.call("submit", **args)
    with pytest.raises(UsageError, match=r"limits\.jobs"):
        cli.call("cancel", ids=list(range(1, 100_002)))
    # A service's replicas are queued from its spec: checked as a submit's when it is made.
    big_command = {"job": {**base, "command": ["x" * 200_000]}, "env": {}, "cwd": "/"}
    with pytest.raises(UsageError, match=r"limits\.command"):
        cli.call("service", action="create", name="web", spec=big_command)
    assert home.json("ls", "--all") == []  # nothing was queued, and ls answers
    assert cli.call("service", action="list")["services"] == []


def test_limits_come_from_the_config_and_the_daemon_applies_them(home):
    home.write_config('[limits]\nname = "8B"\njobs = 10\n')
    home.start()
    # Within the defaults the client sends it; the daemon applies its own config.
    one_error_line(
        home.run("submit", "--name", "ninechars", "--", "true", check=False),
        2,
        "9 bytes",
        "limit of 8",
        "limits.name",
    )
    one_error_line(
        home.run("submit", "--array", "0-10", "--", "true", check=False),
        2,
        "11 jobs",
        "limits.jobs",
    )
    assert home.submit("--name", "eight888", "--hold", "--", "true")


def test_a_deeply_nested_request_is_refused_before_it_is_decoded(home):
    home.start()
    deep = b'{"cmd":"status","args":{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
    reply = raw_request(home, deep)
    assert reply["ok"] is False
    assert "nests 100,002 levels deep" in reply["error"]["message"]
    assert "limits.json_depth" in reply["error"]["message"]
    assert home.json("ls") == []  # the daemon is still there


# -- paged replies -------------------------------------------------------------------------


def test_ls_and_wait_answer_however_large_the_queue_even_after_it_is_cancelled(home):
    home.start()
    # 200 jobs of a 100 kB command each: 20 MB of listing, over the 16 MiB frame.
    array = home.json("submit", "--hold", "--array", "0-199", "--", "echo", "y" * 100_000)
    array_id = array["array_id"]
    listed = home.json("ls", "-r", "--all")  # plain `ls` lists the first 50 pending
    assert [j["id"] for j in listed] == array["ids"]
    assert listed[-1]["command"] == ["echo", "y" * 100_000]
    home.run("cancel", str(array_id))
    finished = home.json("ls", "--all")
    assert [j["state"] for j in finished] == ["cancelled"] * 200
    waited = home.run("wait", str(array_id), check=False)
    assert waited.returncode == 1 and waited.stderr == ""  # cancelled: status 1, no error
    table = home.run("ls", "--all", "-r", "--format", "jobid,state", "--noheader").stdout
    assert len(table.splitlines()) == 200


def test_ls_all_lists_every_finished_job_not_the_last_thousand(home):
    home.start()
    ids = home.json("submit", "--hold", "--array", "0-1199", "--", "true")["ids"]
    home.run("cancel", str(ids[0]))
    listed = home.run("ls", "--all", "-r", "--format", "jobid", "--noheader").stdout.split()
    assert listed == [str(i) for i in ids]


def test_pages_cover_every_job_once_in_id_order(home):
    home.start()
    ids = home.json("submit", "--hold", "--array", "0-99", "--", "true")["ids"]
    cli = client(home)
    first = cli.call("list", page_bytes=4096)
    assert first["next"] is not None and 0 < len(first["jobs"]) < 100
    assert [j["id"] for j in cli.call_paged("list", page_bytes=4096)["jobs"]] == ids
    shown = cli.call_paged("show", ids=[str(i) for i in ids], page_bytes=4096)["jobs"]
    assert [j["id"] for j in shown] == ids
    with pytest.raises(UsageError, match="page-bytes"):
        cli.call("list", page_bytes=10**9)


# -- waits and connections ----------------------------------------------------------------


def test_a_wait_with_a_nan_infinite_or_negative_timeout_is_refused_at_once(home):
    home.start()
    job = home.submit("--hold", "--", "true")
    for bad in (b"NaN", b"Infinity", b"-1"):
        body = b'{"cmd":"wait","args":{"ids":[%d],"timeout_s":%s}}' % (job, bad)
        reply = raw_request(home, body)
        assert reply["ok"] is False and reply["error"]["message"] == (
            "timeout_s must be a number of at least 0 and at most 1e+09, not "
            f"{ {b'NaN': 'nan', b'Infinity': 'inf', b'-1': '-1'}[bad] }"
        ), reply
    # The client refuses to send one at all (Client.call sends requests this way).
    with pytest.raises(ProtocolError, match="NaN or an infinite number"):
        protocol.encode(
            {"cmd": "wait", "args": {"ids": [job], "timeout_s": float("nan")}}, allow_nan=False
        )


@pytest.fixture
def small_server(tmp_path: Path, monkeypatch):
    """The daemon's socket server for a user held to 4 connections (no uid exempt), whose
    `wait` blocks until released, and whose idle connections are cut after 1 s."""
    monkeypatch.setattr(protocol, "READ_TIMEOUT_S", 1.0)
    release = threading.Event()
    held: list[str] = []  # one entry per `wait` handed over, so counted as waiting

    def dispatch(name, args, creds):
        if name == "wait":
            held.append(name)
            release.wait(120)
        return {"answered": name}

    path = str(tmp_path / "s.sock")
    server = SocketServer(path, dispatch, max_per_uid=4, exempt_uids=())
    server.start()
    yield path, release, held, server
    release.set()
    server.close()
    server.drain()


def _ask(path: str, cmd: str) -> dict:
    """The reply to one request on a new connection; a refused connection's reply may
    come before the request is sent (then sending fails, and the reply is still read)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(path)
        try:
            protocol.send(sock, {"cmd": cmd, "args": {"ids": [1]} if cmd == "wait" else {}})
        except BrokenPipeError:
            pass
        return protocol.receive(sock) or {"ok": False}


def test_connections_waiting_on_jobs_do_not_lock_their_user_out(small_server):
    path, release, held, _ = small_server
    waits = [threading.Thread(target=_ask, args=(path, "wait")) for _ in range(4)]
    for thread in waits:
        thread.start()
    wait_until(lambda: len(held) == 4, "the four waits to be held")
    # Four waits held, the user's limit: anything else is still answered...
    assert _ask(path, "status").get("ok")
    # ...and a fifth wait is told the limit in one line, not queued for ever.
    fifth = _ask(path, "wait")
    assert fifth["ok"] is False and "already waits on 4 connections" in fifth["error"]["message"]
    release.set()
    for thread in waits:
        thread.join(30)


def test_a_flood_of_idle_connections_is_cut_by_the_read_timeout(small_server):
    path, _, _, server = small_server
    idle = []
    for _ in range(4):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        idle.append(sock)
    try:
        # Each is counted by the thread that accepted it: the next may be accepted first.
        wait_until(lambda: sum(server._per_uid.values()) == 4, "the idle ones to be counted")
        refused = _ask(path, "status")
        assert refused["ok"] is False and "open connections" in refused["error"]["message"]
        # The idle ones are closed by the daemon after the read timeout; then it answers.
        assert wait_until(lambda: _ask(path, "status").get("ok"), "the idle ones to be cut")
        assert all(sock.recv(1) == b"" for sock in idle)
    finally:
        for sock in idle:
            sock.close()


def test_the_readme_gives_each_limits_default_as_the_daemon_has_it():
    section = (REPO / "README.md").read_text().split("### Limits", 1)[1].split("\n## ", 1)[0]
    documented = dict(
        re.findall(r"^\| `limits\.(\w+)` \| `?\"?([^`\"|]+)\"?`? \|", section, re.MULTILINE)
    )
    assert documented == {key: str(row[1]) for key, row in limits.CONFIG.items()}


def test_a_name_is_limited_by_limits_name_alone(home):
    # The README says 256 B; the daemon also refused any name over 200 characters.
    home.start()
    job_id = home.submit("--hold", "--name", "n" * 256, "--", "true")
    assert home.show(job_id)["name"] == "n" * 256
    one_error_line(
        home.run("submit", "--name", "n" * 257, "--", "true", check=False),
        2,
        "257 bytes",
        "limit of 256",
        "limits.name",
    )
