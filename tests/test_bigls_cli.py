"""A long queue as a user sees it, through the real CLI and daemon: `ls` shows the running
jobs, the first pending ones and a line for the rest; `ls --all` streams every row, in
pages on one connection (client/pagedreplies.py), while the daemon answers everyone else;
`top` counts what it does not list."""

from __future__ import annotations

import json
import os
import pwd
import re
import socket
import struct

import pytest

from conftest import Home, wait_until
from test_fast_commands import both_paths as fast_and_typer
from test_fast_commands import timeless

pytestmark = pytest.mark.e2e

ME = pwd.getpwuid(os.getuid()).pw_name
BIG_ARG = "x" * 40_000  # 30 of these make `ls --all --json` longer than one page (1 MiB)


@pytest.fixture(scope="module")
def queue(tmp_path_factory):
    """One job running on all four GPUs, then 180 pending: an array of 150 and 30 jobs
    named grid, each with a 40 kB argument."""
    root = tmp_path_factory.mktemp("bigls")
    home = Home(root / "home")
    home.write_config()
    gate = root / "go"
    try:
        fill(home, gate)
        yield home
    finally:
        gate.touch()
        home.cleanup()


def fill(home: Home, gate) -> None:
    home.busy = home.submit(
        "--gpus",
        "4",
        "--name",
        "train",
        "--",
        "sh",
        "-c",
        f"while [ ! -e {gate} ]; do sleep 0.05; done",
    )
    home.wait_state(home.busy, "running")
    # Measured once before any test: `-` and a size would differ between two listings.
    wait_until(lambda: home.show(home.busy)["mem_peak_bytes"], "the running job's memory")
    home.array = json.loads(
        home.run("submit", "--json", "--array", "0-149", "--gpus", "1", "--", "true").stdout
    )["array_id"]
    lines = "".join(f"echo {i} {BIG_ARG}\n" for i in range(30))
    home.grid = json.loads(
        home.run(
            "submit", "--json", "--name", "grid", "--gpus", "1", "--from-file", "-", input=lines
        ).stdout
    )["ids"]


def steady(listing: str) -> str:
    """Output without what moves between two runs: durations, the running job's memory."""
    return timeless(re.sub(r"\d+(\.\d+)? [KMG]?i?B", "SIZE", listing))


def steady_json(document: str) -> object:
    """JSON output without what moves between two runs: the running job's measurements."""
    data = json.loads(document)
    jobs = data["jobs"] if isinstance(data, dict) else data
    for job in jobs:
        job.update(mem_peak_bytes=None, gpu_mem_peak_bytes=None)
    return data


def both_paths(home: Home, *args: str) -> str:
    """`gpusched ARGS`'s output, checked to be the same by the fast path and typer's."""
    same = steady_json if "--json" in args else steady
    out, err, status = fast_and_typer(home, *args, same=same)
    assert status == 0, err
    return out


def test_ls_shows_the_first_pending_jobs_and_counts_the_rest(queue):
    out = both_paths(queue, "ls")
    lines = out.splitlines()
    assert lines[1].split()[:4] == [str(queue.busy), ME, "train", "running"]
    assert lines[2].split()[:4] == [f"{queue.array}_[0-49]", ME, "true", "50"]
    assert lines[3:] == [
        f"and 130 more pending: 100 of array {queue.array}, 30 named grid "
        f"({ME}) (--all lists every job)"
    ]


def test_ls_json_carries_the_summary(queue):
    reply = json.loads(both_paths(queue, "ls", "--json"))
    assert [job["id"] for job in reply["jobs"]] == [queue.busy] + list(
        range(queue.array, queue.array + 50)
    )
    assert reply["more_pending"] == {
        "count": 130,
        "others": 0,
        "other_groups": 0,
        "groups": [
            {"count": 100, "array_id": queue.array, "user": ME, "name": "true"},
            {"count": 30, "array_id": None, "user": ME, "name": "grid"},
        ],
    }


def test_filters_keep_working(queue):
    grid = json.loads(both_paths(queue, "ls", "--json", "--name", "grid"))
    assert [job["id"] for job in grid] == queue.grid  # all shown: a plain list
    assert [job["id"] for job in json.loads(both_paths(queue, "ls", "--json", "-t", "R"))] == [
        queue.busy
    ]
    pending = json.loads(both_paths(queue, "ls", "--json", "--me", "--state", "pending"))
    assert len(pending["jobs"]) == 50 and pending["more_pending"]["count"] == 130
    assert both_paths(queue, "ls", "--user", "nobody") == (
        "no jobs match (--all looks at finished ones too)\n"
    )


def test_ls_all_json_lists_every_job_as_one_document(queue):
    jobs = json.loads(both_paths(queue, "ls", "--all", "--json"))
    assert [job["id"] for job in jobs] == [
        queue.busy,
        *range(queue.array, queue.array + 150),
        *queue.grid,
    ]
    assert all(BIG_ARG in job["command"][-1] for job in jobs[-30:])


def test_ls_all_folds_the_array_however_the_pages_fall(queue):
    out = both_paths(queue, "ls", "--all")
    assert f"{queue.array}_[0-149]" in out and "150 pending" in out
    assert out.count("\nID ") + out.startswith("ID ") == 1  # one header
    assert len(out.splitlines()) == 1 + 1 + 1 + 30


def request_frames(home: Home, message: dict) -> list[dict]:
    """The frames the daemon answers `message` with: one, or a stream's up to its last."""
    status = json.loads(home.run("daemon", "status", "--json").stdout)
    frames = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(status["socket"])
        body = json.dumps(message).encode()
        sock.sendall(struct.pack(">I", len(body)) + body)
        with sock.makefile("rb") as stream:
            while True:
                (size,) = struct.unpack(">I", stream.read(4))
                frames.append(json.loads(stream.read(size)))
                if (
                    not message["args"].get("stream")
                    or not frames[-1]["ok"]
                    or frames[-1]["result"].get("next") is None
                ):
                    return frames


def test_a_streamed_list_comes_in_pages_on_one_connection(queue):
    frames = request_frames(
        queue, {"cmd": "list", "args": {"all": True, "stream": "pages", "page_bytes": 100_000}}
    )
    assert len(frames) > 3 and all(frame["ok"] for frame in frames)
    ids = [job["id"] for frame in frames for job in frame["result"]["jobs"]]
    assert ids == [queue.busy, *range(queue.array, queue.array + 150), *queue.grid]
    # Without "stream", one page as before: the client asks for the next.
    (one,) = request_frames(queue, {"cmd": "list", "args": {"all": True, "page_bytes": 100_000}})
    # (The ids: a running job's figures move between the two requests.)
    assert [job["id"] for job in one["result"]["jobs"]] == [
        job["id"] for job in frames[0]["result"]["jobs"]
    ]


def test_the_daemon_answers_others_while_a_stream_waits_for_its_reader(queue):
    """A reader that stops reading holds its own connection, not the daemon's loop."""
    status = json.loads(queue.run("daemon", "status", "--json").stdout)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(30)  # a daemon that sends nothing fails the test, not hangs it
        sock.connect(status["socket"])
        body = json.dumps(
            {"cmd": "list", "args": {"all": True, "stream": "pages", "page_bytes": 1024}}
        ).encode()
        sock.sendall(struct.pack(">I", len(body)) + body)
        wait_until(lambda: len(sock.recv(4, socket.MSG_PEEK)) == 4, "the first page")
        # The stream's pages (over 1 MiB) now fill the socket; nobody reads them.
        assert queue.run("ls", "--name", "train").stdout.splitlines()[1].split()[0] == str(
            queue.busy
        )
        assert json.loads(queue.run("daemon", "status", "--json").stdout)["pending"] == 180


def test_top_counts_the_pending_jobs_it_does_not_list(queue):
    out = queue.run("top", "--once").stdout
    assert "1 running · 180 pending" in out and "Pending (180)" in out
    assert "... 80 more" in out
    (frame,) = request_frames(queue, {"cmd": "snapshot", "args": {"lean": True}})
    pending = [job for job in frame["result"]["jobs"] if job["state"] == "pending"]
    assert len(pending) == 100 and frame["result"]["pending_total"] == 180


def test_a_submit_is_answered_between_the_pages_of_a_big_listing(home):
    """`ls --all --json` of a big queue holds the loop a page at a time: a submit made
    while it streams is answered, and taken into the same listing's later pages."""
    home.start()
    home.run("submit", "--hold", "--array", "0-199", "--", "echo", BIG_ARG)
    status = json.loads(home.run("daemon", "status", "--json").stdout)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(30)
        sock.connect(status["socket"])
        body = json.dumps(
            {"cmd": "list", "args": {"all": True, "stream": "pages", "page_bytes": 1024}}
        ).encode()
        sock.sendall(struct.pack(">I", len(body)) + body)
        with sock.makefile("rb") as stream:

            def page() -> dict:
                (size,) = struct.unpack(">I", stream.read(4))
                return json.loads(stream.read(size))

            pages = [page()]
            assert pages[0]["result"]["next"] is not None  # 8 MB of rows: far from done
            new = home.submit("--hold", "--", "true")
            while pages[-1]["result"]["next"] is not None:
                pages.append(page())
    ids = [job["id"] for each in pages for job in each["result"]["jobs"]]
    assert ids[-1] == new and len(ids) == 201
