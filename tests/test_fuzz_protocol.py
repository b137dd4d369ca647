"""Fuzzing the wire: the frame decoder over random bytes, and every command of the protocol
table with random arguments through the daemon in this process (the socket server's
envelope, the loop, the handlers and a real SQLite store).

What must hold for any input: nothing raises inside the daemon (its log has no "request
... failed" traceback), every reply is a result or {"ok": false, "error": one line}, and a
refused request leaves the queue as it was.
"""

from __future__ import annotations

import json
import logging
import socket
import sqlite3
import struct
import threading

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpusched.client import protocol
from gpusched.core.errors import ERROR_KINDS, ProtocolError
from gpusched.core.spec import jobspec
from gpusched.daemon.loop import Call
from gpusched.daemon.requests.request import WAIT_SLICE_S, Request
from gpusched.daemon.requests.server import SocketServer
from inproc import ME, Box

# Examples per property: enough to cover each command's arguments many times over, few
# enough that the file takes seconds, not minutes.
EXAMPLES = 300
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
HEADER = struct.Struct(">I")

# Values that found bugs, or sit on a boundary, beside whatever hypothesis makes up.
SPECIAL = st.sampled_from(
    [
        None,
        True,
        False,
        0,
        1,
        -1,
        2**31,
        2**63 - 1,
        2**63,
        2**70,
        -(2**70),
        1e308,
        float("nan"),
        float("inf"),
        0.5,
        "",
        "\0",
        "\ud800",
        "x\udcff",
        "1",
        "1_0",
        "2_",
        "_1",
        "9" * 30,
        "-1",
        [],
        {},
        [True],
        [[1]],
        [None],
        {"": 1},
        "a=b",
        "/",
    ]
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**80), 2**80)
    | st.floats()
    | st.text(max_size=12)
    | SPECIAL
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)

GOOD_SPEC = {"command": ["true"], "gpus": 1, "hold": True}
# A good value for each field of a job spec, so that a spec is often one bad field away
# from being queued (not refused at its first field every time).
GOOD_FIELDS = {
    "command": ["sh", "-c", "exit 0"],
    "name": "n",
    "gpus": 2,
    "gpu_mem_bytes": 2**30,
    "cpus": 1,
    "mem_bytes": 2**20,
    "priority": 5,
    "hold": True,
    "kill_on_invalid_dep": True,
    "dependencies": [["afterok", 1]],
    "retries": 1,
    "retry_on": ["failed"],
    "retry_delay_s": 1.0,
    "policy": "spread",
    "time_limit_s": 60,
    "warn_signal": 10,
    "warn_before_s": 5,
    "warn_batch": True,
    "array": {"indices": [0, 1], "throttle": 1},
    "preemptible": True,
    "preempt_grace_s": 30.0,
    "constraints": {
        "gpu_ids": [0, 1],
        "exclude_gpus": [3],
        "gpu_type": "",
        "min_gpu_total_mem_bytes": 0,
        "min_compute_capability": [1, 0],
    },
    "gpu_mem_auto": False,
    "mem_growth": 1.5,
    "interactive": True,
    "pty": True,
    "container": ["busybox", "--shm-size=1g"],
    "output": "/dev/null",
    "error": "/dev/null",
    "open_mode": "append",
    "begin_time": 1_700_000_060.5,
    "reservation": "demo",
    "gpu_mem_over": "stop",
}
assert set(GOOD_FIELDS) == set(jobspec.SPEC_FIELDS)
ANY = SCALARS | JSON  # mostly single values: most checks are of one value's kind
NESTED = {
    "constraints": st.fixed_dictionaries(
        {}, optional=dict.fromkeys(jobspec.CONSTRAINT_FIELDS, ANY)
    ),
    "array": st.fixed_dictionaries(
        {"indices": st.lists(SCALARS, max_size=3) | ANY}, optional={"throttle": ANY}
    ),
}


@st.composite
def job_specs(draw) -> dict:
    """A spec with up to three fields set to a good value or anything at all (a nested
    one: an object of its fields, each anything), now and then one of no known name."""
    spec = dict(GOOD_SPEC)
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.integers(0, 9)) == 0:
            spec[draw(st.text(max_size=6))] = draw(ANY)
            continue
        field = draw(st.sampled_from(jobspec.SPEC_FIELDS))
        spec[field] = draw(st.just(GOOD_FIELDS[field]) | NESTED.get(field, ANY) | ANY)
    return spec


# A good value for each argument of each command (ids name the box's seeded jobs).
GOOD_ARGS = {
    "jobs": st.lists(job_specs(), min_size=1, max_size=2),
    "env": st.just({"A": "b"}),
    "cwd": st.just("/"),
    "all": st.booleans(),
    "lean": st.booleans(),
    "keep_waiting": st.booleans(),
    "after": st.integers(0, 5),
    "pending_version": st.sampled_from(["", "x.1"]),
    "dry_run": st.booleans(),
    "page_bytes": st.sampled_from([1024, 2**20]),
    "last": st.integers(1, 5),
    "pending_rows": st.integers(0, 3),
    "start": st.booleans(),
    "users": st.just(["nobody"]),
    "states": st.just(["pending", "succeeded"]),
    "names": st.just(["*"]),
    "ids": st.lists(st.sampled_from([1, 2, "2_1", "3"]), min_size=1),
    "id": st.sampled_from([1, "2_0", 3]),
    "priority": st.just(3),
    "begin_time": st.sampled_from([0, 1_700_000_060.5]),
    "gpus": st.sampled_from([[0], [1, 2], [9]]),
    "gpu_mem_over": st.sampled_from(["report", "stop", "requeue"]),
    "start_time": st.sampled_from([0, 1_700_000_060.5]),
    "end_time": st.sampled_from([0, 1_700_003_600.5, 4e9]),
    "timeout_s": st.just(0.5),
    "changes": st.sampled_from([{"priority": 1}, {"gpus": 0}, {"hold": True}]),
    "since_s": st.sampled_from([0, 3600.5]),
    "by": st.sampled_from(["user", "name"]),
    "cluster": st.sampled_from(["local", "nosuch"]),
    "key": st.sampled_from(["train", "python a.py"]),
    # Services: no create (it would start a real HAProxy); the rest on no service at all.
    "action": st.sampled_from(["list", "show", "scale", "update", "delete"]),
    "name": st.sampled_from(["web", "x"]),
    "replicas": st.integers(0, 3),
    "spec": st.sampled_from([{}, {"min_replicas": 1, "max_replicas": 2}]),
    "stream": st.sampled_from(["lines", "pages"]),
}
assert set(GOOD_ARGS) == set(protocol.ARGUMENTS)


@st.composite
def requests(draw) -> dict:
    """A request for any command of the table: each of its arguments good, random or left
    out (a required one is left out now and then too), sometimes an extra one."""
    name = draw(st.sampled_from(sorted(protocol.COMMANDS)))
    spec = protocol.COMMANDS[name]
    args = {}
    for arg in sorted(spec.required | spec.optional):
        if arg in spec.optional and draw(st.booleans()):
            continue
        args[arg] = draw(GOOD_ARGS[arg] | ANY)
    if draw(st.integers(0, 9)) == 0:
        args[draw(st.text(max_size=6))] = draw(JSON)
    if draw(st.integers(0, 19)) == 0 and spec.required:
        args.pop(sorted(spec.required)[0], None)
    return {"cmd": name, "args": args}


# -- the frame decoder ----------------------------------------------------------------------
def frame(body: bytes) -> bytes:
    return HEADER.pack(len(body)) + body


BODIES = (
    st.binary(max_size=64)
    | JSON.map(lambda v: json.dumps(v).encode())
    | st.builds(lambda req: json.dumps(req).encode(), requests())
    | st.text(max_size=30).map(lambda t: t.encode("utf-16"))
    | st.sampled_from(
        [
            b"",
            b"{",
            b"[1]",
            b'"ping"',
            b"null",
            b"NaN",
            b'{"cmd": NaN}',
            b'{"cmd":"show","args":{"ids":[' + b"9" * 5000 + b"]}}",
            b'{"cmd":"ping","cmd":"status"}',
            b'{"a":"\\ud800"}',
            b"\xff\xfe",
        ]
    )
)


@st.composite
def wires(draw) -> bytes:
    """What a peer sends: whole frames, a frame cut short, a header that lies about its
    length, or random bytes."""
    body = draw(BODIES)
    kind = draw(st.sampled_from(["frame", "cut", "length", "bytes", "two"]))
    if kind == "frame":
        return frame(body)
    if kind == "cut":
        return frame(body)[: draw(st.integers(0, len(body) + 3))]
    if kind == "length":
        return HEADER.pack(draw(st.integers(0, 2**32 - 1))) + body
    if kind == "two":
        return frame(body) + frame(draw(BODIES))
    return draw(st.binary(max_size=80))


@FUZZ
@given(wires())
def test_the_frame_decoder_returns_an_object_or_refuses_in_one_line(data):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        a.sendall(data)
        a.shutdown(socket.SHUT_WR)  # the peer is done: a short frame must not wait
        try:
            while (message := protocol.receive(b, timeout_s=10)) is not None:
                assert isinstance(message, dict)
        except ProtocolError as exc:
            assert exc.message and "\n" not in exc.message


def test_the_socket_server_answers_every_frame_or_closes(tmp_path):
    """The server's own thread per connection: a bad frame gets a one-line error, a good
    one its answer, and nothing escapes the thread (threading.excepthook)."""
    escaped = []
    server = SocketServer(str(tmp_path / "s.sock"), lambda name, args, creds: {"cmd": name})
    server.start()
    old_hook, threading.excepthook = threading.excepthook, escaped.append
    try:

        @FUZZ
        @given(wires())
        def exchange(data: bytes) -> None:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(30)
                sock.connect(str(tmp_path / "s.sock"))
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)
                replies = []
                try:
                    while (reply := protocol.receive(sock)) is not None:
                        replies.append(assert_reply(reply))
                except ConnectionResetError:
                    pass  # the server closed with bytes of ours unread: after its answer
            assert not escaped, escaped.pop()
            assert replies or not data, "no answer"

        exchange()
    finally:
        threading.excepthook = old_hook
        server.close()


# -- every command's arguments, through the daemon ------------------------------------------
def assert_reply(reply: dict) -> dict:
    """A result, or a refusal in one line that is not the daemon failing."""
    assert isinstance(reply.get("ok"), bool), reply
    if reply["ok"]:
        return reply
    error = reply["error"]
    assert error["kind"] in ERROR_KINDS, error
    message = error["message"]
    assert isinstance(message, str) and message and "\n" not in message, error
    assert "failed on this request" not in message, error
    json.dumps(reply)  # what the server sends must encode
    return reply


class Failures(logging.Handler):
    """Every ERROR the daemon logs: one is an exception inside it."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def failures():
    handler = Failures()
    logging.getLogger("gpusched").addHandler(handler)
    yield handler
    logging.getLogger("gpusched").removeHandler(handler)


def seeded_box(root) -> Box:
    """A daemon with a held job (1), a held array (2-4, element 0 is 2) and a finished job."""
    box = Box(root)
    box.submit("--hold", "--", "true")
    box.submit_all("--hold", "--array", "0-2", "--", "true")
    done = box.submit("--", "true")
    box.exit(done, 0)
    return box


def dispatcher(box: Box):
    """The socket server's dispatch onto the box's loop, a `wait` answered once the clock
    has passed its slice."""

    def dispatch(name: str, args: dict, creds: tuple[int, int, int]):
        call = Call(Request(name, args, creds))
        box.daemon.step([call])
        while not call.done.is_set():
            box.step(WAIT_SLICE_S + 1)
        if call.error is not None:
            raise call.error
        return json.loads(json.dumps(call.result))

    return dispatch


def stored(box: Box) -> tuple:
    """The queue as the store and the daemon's memory hold it."""
    with sqlite3.connect(f"file:{box.paths.db}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT * FROM jobs ORDER BY id").fetchall()
    return rows, dict(box.daemon.state.jobs)


@pytest.fixture
def handle(tmp_path, failures):
    """A request through the socket server's envelope to a seeded daemon, checked: its
    reply is a result or a one-line refusal, nothing raised inside, and a refusal left
    the queue as it was."""
    box = seeded_box(tmp_path / "box")
    server = SocketServer(str(tmp_path / "s.sock"), dispatcher(box))

    def check(message: dict) -> None:
        box.send("status")  # a scheduling pass first: the request's own is then a no-op
        before, failures.records[:] = stored(box), []
        reply = server._handle(message, ME)
        assert not failures.records, failures.records[0].getMessage()
        assert_reply(reply)
        if not reply["ok"]:
            assert stored(box) == before, message

    yield check
    server.close()
    box.close()


# What the fuzzers found, kept as examples: each raised inside the daemon.
def test_any_request_is_answered_and_a_refused_one_changes_nothing(handle):
    @FUZZ
    @given(requests())
    @example({"cmd": "list", "args": {"after": None, "states": ["succeeded"]}})
    @example({"cmd": "list", "args": {"states": [["x"]]}})
    @example({"cmd": "wait", "args": {"ids": [1], "timeout_s": "x"}})
    @example({"cmd": "cancel", "args": {"ids": ["9" * 5000]}})
    @example({"cmd": "submit", "args": {"jobs": [{"command": ["x"]}], "cwd": "/\ud800"}})
    def request(message: dict) -> None:
        handle(message)

    request()


def test_job_specs_alone_are_answered_and_refusals_queue_nothing(handle):
    """The submit request's jobs, the richest argument, on their own."""

    @FUZZ
    @given(st.lists(job_specs(), min_size=1, max_size=3))
    @example([{**GOOD_SPEC, "gpus": None}])
    @example([{**GOOD_SPEC, "array": 5}])
    @example([{**GOOD_SPEC, "array": {"indices": [2**70]}}])
    @example([{**GOOD_SPEC, "retry_on": [[1]]}])
    @example([{**GOOD_SPEC, "dependencies": [["afterok", 2**70]]}])
    @example([{**GOOD_SPEC, "name": "\ud800"}])
    def submit(jobs: list) -> None:
        handle({"cmd": "submit", "args": {"jobs": jobs, "cwd": "/"}})

    submit()
