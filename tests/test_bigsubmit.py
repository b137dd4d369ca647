"""Submits of any size (issue 23): `--from-file` streams its lines, stored in batches with
contiguous ids; a bad line or a Ctrl-C leaves nothing queued, and says so."""

from __future__ import annotations

import fcntl
import json
import signal
import socket
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import Home, wait_until
from gpusched.client import protocol
from gpusched.client.wire import MAX_FRAME_BYTES
from gpusched.daemon.loop import Call
from gpusched.daemon.requests import batches
from gpusched.daemon.requests.request import Request
from inproc import ME

OTHER = (2, 4242, 4242)


def test_a_sweep_larger_than_one_message_is_queued_in_order_with_contiguous_ids(
    home: Home, tmp_path: Path
):
    # 3,000 lines of 6 KB: as one request, over the largest frame (what main sent and refused).
    lines = [f"echo {i} {'x' * 6000}" for i in range(3000)]
    assert sum(map(len, lines)) > MAX_FRAME_BYTES
    sweep = tmp_path / "sweep.txt"
    sweep.write_text("# a sweep\n" + "\n".join(lines) + "\n")
    ids = home.json("submit", "--hold", "--gpus", "0", "--from-file", str(sweep))["ids"]
    assert ids == list(range(ids[0], ids[0] + 3000))
    for at in (0, 1234, 2999):
        assert home.show(ids[at])["command"] == ["/bin/sh", "-c", lines[at]]


def test_a_bad_line_is_named_and_nothing_is_queued(home: Home, tmp_path: Path):
    queued = home.submit("--hold", "--", "true")  # bad input loses nothing already queued
    sweep = tmp_path / "sweep.txt"  # line 8 over the 128 KiB a command may have
    sweep.write_text(
        "true\n" * 6
        + "# six good lines, then one too long\n"
        + "echo "
        + "y" * 140_000
        + "\n"
        + "true\n" * 3
    )
    proc = home.run("submit", "--hold", "--from-file", str(sweep), check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"Error: line 8 of --from-file {sweep}: the command is ")
    assert "nothing was queued" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert [j["id"] for j in home.jobs()] == [queued]


def test_the_daemon_refuses_a_bad_streamed_line_by_its_number(home: Home):
    """A client that skips its own checks: the daemon checks each line as it arrives."""
    from gpusched.client import streamedrequest
    from gpusched.client.connection import Client
    from gpusched.client.paths import resolve_paths
    from gpusched.core.errors import UsageError

    home.write_config('[limits]\ncommand = "1KiB"\n')
    home.start()
    client = Client(resolve_paths({"GPUSCHED_HOME": str(home.path)}), autostart=False)
    request = {
        "jobs": [{"command": ["/bin/sh", "-c"], "hold": True}],
        "cwd": str(home.path),
        "env": {"PATH": "/bin"},
    }
    with pytest.raises(UsageError, match=r"^command 3 of the submit is 2,0"):
        streamedrequest.call_streamed(
            client, "submit", "lines", ["true", "true", "x" * 2000, "true"], **request
        )
    assert home.jobs() == []
    ids = streamedrequest.call_streamed(client, "submit", "lines", ["true"] * 5, **request)["ids"]
    assert len(ids) == 5


@contextmanager
def piped_submit(home: Home, *options: str, **env: str) -> Iterator[subprocess.Popen]:
    """`gpusched submit OPTIONS --from-file -` reading a pipe the test writes; killed
    after if it is still there."""
    client = subprocess.Popen(
        [sys.executable, "-m", "gpusched", "submit", *options, "--from-file", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**home.env, **env},
        cwd=home.path,
        preexec_fn=_ctrl_c_as_at_a_terminal,
    )
    try:
        yield client
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()


def _ctrl_c_as_at_a_terminal() -> None:
    """SIGINT's default action in the client, as a terminal's foreground command has it:
    a suite started in the background of a script inherits SIGINT ignored, and Python
    then installs no KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _unread_bytes(pipe) -> int:
    return int.from_bytes(fcntl.ioctl(pipe.fileno(), termios.FIONREAD, b"\0" * 4), sys.byteorder)


@pytest.mark.parametrize("typer_path", ["", "1"], ids=["fast", "typer"])
def test_ctrl_c_while_a_sweep_streams_queues_nothing_and_says_so(home: Home, typer_path: str):
    home.start()
    with piped_submit(home, "--hold", GPUSCHED_NO_FAST_PATH=typer_path) as client:
        # More than the client reads before it connects (64 KiB): once it has read all,
        # it is mid-stream, its request sent and the pipe still open.
        client.stdin.write("true\n" * 40_000)
        client.stdin.flush()
        wait_until(lambda: _unread_bytes(client.stdin) == 0, "the client to read the lines")
        client.send_signal(signal.SIGINT)
        out, err = client.communicate(timeout=60)
    assert client.returncode == 130, err
    assert out == ""
    assert err.strip() == "Interrupted: nothing of this submit was queued."
    assert home.jobs() == []


def streamed_call(box, count: int) -> Call:
    """A streamed submit of `count` lines handed to the loop, as the server hands it."""
    args = {
        "jobs": [{"command": ["/bin/sh", "-c"], "hold": True, "gpus": 0}],
        "cwd": str(box.root),
        "env": {"PATH": "/bin"},
        "stream": "lines",
        "lines": [f"echo {i}" for i in range(count)],
    }
    call = Call(Request("submit", args, ME))
    box.daemon.step([call])
    assert call.batched is not None and not call.done.is_set()
    return call


def test_a_submit_cancelled_while_it_is_stored_leaves_nothing(box):
    call = streamed_call(box, 3 * batches.BIG_JOBS)
    box.step()
    box.step()  # some batches stored, not yet acknowledged
    call.cancelled = True  # the connection thread saw the client's cancel
    box.step()
    assert call.done.is_set() and "nothing of it was queued" in call.error.message
    assert box.call("list", all=True)["jobs"] == []
    assert box.daemon.state.store.active() == []
    later = box.submit("--hold", "--", "true")
    assert later > 3 * batches.BIG_JOBS  # its ids stay used, as after a crash


def test_ids_stay_contiguous_while_another_user_submits(box):
    call = streamed_call(box, 3 * batches.BIG_JOBS)
    other = box.call("submit", OTHER, jobs=[{"command": ["true"], "hold": True}], cwd="/", env={})[
        "ids"
    ]
    while not call.done.is_set():
        box.step()
    ids = call.result["ids"]
    assert ids == list(range(ids[0], ids[0] + 3 * batches.BIG_JOBS))
    assert other[0] not in ids
    shown = box.call("show", ids=[ids[-1]])["jobs"][0]
    assert shown["command"] == ["/bin/sh", "-c", f"echo {3 * batches.BIG_JOBS - 1}"]


def test_a_disk_full_halfway_queues_nothing(box):
    call = streamed_call(box, 3 * batches.BIG_JOBS)
    box.step()
    with box.failing_writes():
        box.step()
    assert call.done.is_set() and "nothing of this submit was queued" in call.error.message
    assert box.call("list", all=True)["jobs"] == []


def test_an_array_sweep_is_stored_alike_with_its_throttle(box):
    ids = box.submit_all("--hold", "--gpus", "0", "--array", "0-4999%8", "--", "true")
    assert ids == list(range(ids[0], ids[0] + 5000))
    last = box.call("show", ids=[ids[-1]])["jobs"][0]
    assert (last["array_id"], last["array_index"], last["array_throttle"]) == (ids[0], 4999, 8)
    assert json.loads(json.dumps(last["command"])) == ["true"]


def test_a_slow_pipe_keeps_the_stream_open(home: Home):
    """A generator script that pauses longer than the daemon waits for a frame: the
    client sends empty parts meanwhile, and every line is queued."""
    home.start()
    with piped_submit(home, "--json", "--hold") as client:
        client.stdin.write("echo 1\n")
        client.stdin.flush()
        # It has read the first line; it connects and sends the request right after.
        wait_until(lambda: _unread_bytes(client.stdin) == 0, "the client to read the line")
        # The producer is slow: nothing more for longer than the daemon waits for a frame.
        pause_until = time.monotonic() + protocol.READ_TIMEOUT_S + 2
        wait_until(lambda: time.monotonic() > pause_until, "the producer's pause")
        client.stdin.write("echo 2\n")
        out, err = client.communicate(timeout=60)
    assert client.returncode == 0, err
    ids = json.loads(out)["ids"]
    assert [home.show(i)["command"][-1] for i in ids] == ["echo 1", "echo 2"]


def test_jobs_stored_alike_read_back_as_stored_whole(tmp_path: Path):
    """Store.insert_alike leaves the columns at their defaults out: every field of a job
    must read back exactly as Store.insert, which writes every column, stores it."""
    from dataclasses import replace

    from gpusched.core.models import Constraints, Job, job_with
    from gpusched.core.models import Request as JobRequest
    from gpusched.store.database import Store

    store = Store(tmp_path / "queue.db")
    templates = [
        Job(id=0, command=("/bin/sh", "-c"), cwd="/w", uid=7, user="u", env={"A": "b"}),
        Job(
            id=0,
            command=("python", "x.py"),
            cwd="/w",
            uid=7,
            user="u",
            env={},
            name="n",
            priority=-3,
            held=True,
            retries=2,
            retry_delay_s=10.0,
            mem_growth=1.5,
            preemptible=True,
            preempt_grace_s=60,
            retry_on=("failed", "timeout"),
            dependencies=(("afterok", 1),),
            time_limit_s=3600.0,
            warn_batch=True,
            container=("img",),
            request=JobRequest(
                gpus=2, gpu_mem_bytes=10**9, cpus=4, constraints=Constraints(gpu_type="H100")
            ),
        ),
    ]
    with store.write():
        for n, template in enumerate(templates):
            whole = replace(template, id=100 + n, command=(*template.command, "a"))
            store.insert([whole])
            alike = job_with(template, id=200 + n, command=(*template.command, "a"))
            store.insert_alike(template, [alike])
    for n in range(len(templates)):
        assert replace(store.get(200 + n), id=0) == replace(store.get(100 + n), id=0)
        assert store.get(200 + n).env == templates[n].env


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """KeyboardInterrupt on SIGINT, as in a terminal, even where the suite was started
    with SIGINT ignored (in the background of a script)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_after_the_daemon_stored_everything_prints_the_ids(
    tmp_path: Path, capsys, ctrl_c_raises
):
    """The cancel comes too late: the daemon answers with the jobs it queued, and the
    command prints them as it would have, and says how to cancel them."""
    import threading

    from gpusched.client import wire
    from gpusched.client.connection import Client
    from gpusched.client.paths import resolve_paths
    from gpusched.client.submit.options import SubmitOptions
    from gpusched.client.submit.submitting import submit_streamed

    ours, daemons = socket.socketpair()

    def daemon() -> None:  # reads the stream; Ctrl-C comes once it ended; then the cancel
        while not wire.receive(daemons).get("end"):
            pass
        # To the main thread: a signal to the process may be taken by this thread, and
        # the main one, blocked reading the reply, would not see it.
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        assert wire.receive(daemons) == {"cancel": True}
        wire.send(daemons, {"ok": True, "result": {"ids": list(range(5, 11)), "array_ids": []}})

    class Connected(Client):
        def connect(self):
            return ours

    client = Connected(
        resolve_paths({"GPUSCHED_HOME": str(tmp_path)}), autostart=False, check_daemon=False
    )
    thread = threading.Thread(target=daemon)
    thread.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            submit_streamed(
                client,
                {"jobs": [{"command": ["/bin/sh", "-c"]}], "cwd": "/"},
                iter(["true"] * 6),
                SubmitOptions(),
            )
    finally:
        thread.join()
        daemons.close()
    out, err = capsys.readouterr()
    assert out.split() == [str(i) for i in range(5, 11)]
    assert err == (
        "Interrupted too late: jobs 5 to 10 were queued already; "
        "`gpusched cancel $(seq 5 10)` cancels them.\n"
    )


def test_jobs_start_and_others_are_answered_while_a_sweep_is_stored(box):
    call = streamed_call(box, 3 * batches.BIG_JOBS)
    other = box.call("submit", OTHER, jobs=[{"command": ["true"], "gpus": 1}], cwd="/", env={})[
        "ids"
    ][0]
    assert not call.done.is_set()
    assert other in box.running()  # started between two batches of the sweep
    assert [j["id"] for j in box.call("list", all=True)["jobs"]] == [other]
    while not call.done.is_set():
        box.step()
    assert len(call.result["ids"]) == 3 * batches.BIG_JOBS


def test_gpu_mem_auto_estimates_each_line_of_a_sweep_on_its_own(box):
    """Each line is its own job key, with its own history: the template is made per line."""
    ids = box.submit_all(
        "--gpus",
        "1",
        "--gpu-mem",
        "auto",
        "--hold",
        "--from-file",
        "-",
        stdin="python a.py\npython b.py\n",
    )
    jobs = [box.daemon.state.jobs[i] for i in ids]
    assert [j.job_key for j in jobs] == ["sh -c python a.py", "sh -c python b.py"]
    assert [j.command[-1] for j in jobs] == ["python a.py", "python b.py"]
    assert all(j.gpu_mem_reason for j in jobs)


def test_job_with_is_dataclasses_replace_without_init():
    """models.job_with, the cheap copy of a job with some fields changed, gives exactly
    what dataclasses.replace gives, for every field of the (frozen, slotted) Job."""
    from dataclasses import fields, replace

    from gpusched.core.models import Job, job_with

    job = Job(
        id=3,
        command=("true",),
        cwd="/w",
        uid=7,
        user="u",
        env={"A": "b"},
        name="n",
        priority=2,
        held=True,
        dependencies=(("afterok", 1),),
    )
    changes = {"id": 4, "array_id": 9, "array_index": 1, "pending_reason": "Priority"}
    copied = job_with(job, **changes)
    assert copied == replace(job, **changes)
    assert all(
        getattr(copied, f.name) == getattr(replace(job, **changes), f.name) for f in fields(Job)
    )
    assert job.id == 3 and job.pending_reason != "Priority"  # the original is untouched
