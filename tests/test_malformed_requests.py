"""Malformed requests sent as any process on the socket can send them, to a real daemon:
each gets a one-line refusal, changes nothing, and raises nothing inside the daemon."""

from __future__ import annotations

import json
import socket
import struct

import pytest

from conftest import Home
from gpusched.client import protocol

pytestmark = pytest.mark.e2e

HEADER = struct.Struct(">I")
JOB = {"command": ["true"]}


def raw_exchange(home: Home, body: bytes) -> dict | None:
    """One frame of these bytes to the home's daemon, and its reply (None: no reply)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(home.path / "run" / "gpusched.sock"))
        sock.sendall(HEADER.pack(len(body)) + body)
        return protocol.receive(sock)


def ask(home: Home, cmd: str, **args) -> dict | None:
    return raw_exchange(home, json.dumps({"cmd": cmd, "args": args}).encode())


def queue(home: Home) -> list[dict]:
    reply = ask(home, "list", all=True)
    assert reply is not None and reply["ok"], reply
    return reply["result"]["jobs"]


@pytest.fixture(scope="module")
def daemon_home(tmp_path_factory):
    """One real daemon with a held job and a held array: nothing sent here may change them."""
    home = Home(tmp_path_factory.mktemp("malformed") / "home")
    home.write_config()
    home.start()
    home.run("submit", "--hold", "--", "true")
    home.run("submit", "--hold", "--array", "0-2", "--", "true")
    yield home
    home.cleanup()


def submit(**job) -> dict:
    return {"jobs": [{**JOB, **job}], "cwd": "/"}


# Most were an exception inside the daemon ("the daemon failed on this request"),
# no reply at all, or a value taken for another (true as index 1, "no" as a hold).
MALFORMED = {
    "5000-digit id as text": ("cancel", {"ids": ["9" * 5000]}),
    "id over 2**63": ("show", {"ids": [2**70]}),
    "array that is a number": ("submit", submit(array=5)),
    "array index true": ("submit", submit(array={"indices": [True]})),
    "array index 2**70": ("submit", submit(array={"indices": [2**70]})),
    "array throttle 2**70": ("submit", submit(array={"indices": [1], "throttle": 2**70})),
    "array throttle true": ("submit", submit(array={"indices": [1], "throttle": True})),
    "array index twice": ("submit", submit(array={"indices": [1, 1]})),
    "retry_on of lists": ("submit", submit(retry_on=[[1]])),
    "dependency on 2**70": ("submit", submit(dependencies=[["afterok", 2**70]])),
    "dependency kind a list": ("submit", submit(dependencies=[[["afterok"], 1]])),
    "hold as text": ("submit", submit(hold="no")),
    "gpu index true": ("submit", submit(gpus=1, constraints={"gpu_ids": [True]})),
    "capability true": (
        "submit",
        submit(gpus=1, constraints={"min_compute_capability": [True, 0]}),
    ),
    "misspelt field": ("submit", submit(gpu=1)),
    "command with NUL": ("submit", submit(command=["tr\0ue"])),
    "name with a lone surrogate": ("submit", submit(name="\ud800")),
    "cwd with a lone surrogate": ("submit", {"jobs": [JOB], "cwd": "/\ud800"}),
    "cwd with NUL": ("submit", {"jobs": [JOB], "cwd": "/\0"}),
    "env name with =": ("submit", {**submit(), "env": {"A=B": "x"}}),
    "env value a number": ("submit", {**submit(), "env": {"A": 1}}),
    "time limit 1e308": ("submit", submit(time_limit_s=1e308)),
    "jobs an object": ("submit", {"jobs": JOB, "cwd": "/"}),
    "list states of lists": ("list", {"states": [["x"]]}),
    "list all as text": ("list", {"all": "yes"}),
    "wait timeout as text": ("wait", {"ids": [1], "timeout_s": "x"}),
    "wait timeout a list": ("wait", {"ids": [1], "timeout_s": [1]}),
    "snapshot lean as text": ("snapshot", {"lean": "no"}),
    "resubmit hold as text": ("resubmit", {"id": 1, "changes": {"hold": "yes"}}),
    "empty array index (cancel 5_)": ("cancel", {"ids": ["2_"]}),
    # Issue 32: taken as the default topology, and an index far past any array's size.
    "topology false": ("submit", submit(gpus=1, constraints={"topology": False})),
    "topology 0": ("submit", submit(gpus=1, constraints={"topology": 0})),
    "array index 2**40": ("submit", submit(array={"indices": [2**40]})),
    "array index 1,000,000": ("submit", submit(array={"indices": [0, 10**6]})),
}


def assert_one_line_refusal(reply: dict | None) -> None:
    assert reply is not None, "no reply at all"
    assert reply["ok"] is False, reply
    message = reply["error"]["message"]
    assert reply["error"]["kind"] in ("usage", "protocol", "not_found"), reply
    assert message and "\n" not in message and len(message) < 400, message
    assert "failed on this request" not in message, message


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_request_gets_a_one_line_refusal_and_changes_nothing(daemon_home, case):
    cmd, args = MALFORMED[case]
    before, log = queue(daemon_home), daemon_home.state / "daemon.log"
    log_bytes = log.stat().st_size
    assert_one_line_refusal(ask(daemon_home, cmd, **args))
    assert queue(daemon_home) == before
    with log.open() as lines:
        lines.seek(log_bytes)
        assert "Traceback" not in lines.read()


def test_an_integer_of_5000_digits_is_answered(daemon_home):
    """Python's json refuses integers of over 4300 digits with a ValueError, which the
    daemon did not catch: the connection closed with no reply."""
    body = b'{"cmd": "show", "args": {"ids": [' + b"9" * 5000 + b"]}}"
    reply = raw_exchange(daemon_home, body)
    assert_one_line_refusal(reply)
    assert reply["error"]["message"] == "message has an integer of more than 4300 digits"
    assert ask(daemon_home, "ping")["ok"] is True


def test_a_refused_hold_value_is_not_taken_for_true(daemon_home):
    """{"hold": "no"} once queued a held job: Python counts any non-empty string as true."""
    reply = ask(daemon_home, "submit", **submit(hold="no"))
    assert reply["error"]["message"] == "--hold must be true or false, not 'no'"


def test_a_null_argument_or_field_is_one_not_given(daemon_home):
    """Null where a default exists is that default: {"gpus": null} and a `list` with a
    null page argument once raised inside the daemon."""
    reply = ask(daemon_home, "submit", **submit(gpus=None, hold=True))
    assert reply["ok"], reply
    (job_id,) = reply["result"]["ids"]
    assert ask(daemon_home, "show", ids=[job_id])["result"]["jobs"][0]["gpus_requested"] == 0
    reply = ask(daemon_home, "list", after=None, states=["cancelled", "pending"])
    assert reply["ok"], reply
    assert job_id in [job["id"] for job in reply["result"]["jobs"]]
    assert ask(daemon_home, "cancel", ids=[job_id])["ok"]


@pytest.mark.parametrize(
    "body",
    [
        b'{"cmd": "ping", "cmd": "stop"}',
        b'{"cmd": "submit", "args": {"jobs": [{"command": ["true"], "hold": true, "hold": false}],'
        b' "cwd": "/"}}',
        b'{"cmd": "submit", "args": {"jobs": [{"command": ["true"], "hold": true}], "cwd": "/",'
        b' "cwd": "/tmp"}}',
    ],
)
def test_a_key_given_twice_is_refused_at_any_depth(daemon_home, body):
    """json keeps the last of a key given twice: {"cmd":"ping","cmd":"stop"} stopped the
    daemon, and a proxy that checks the first value would be fooled."""
    before = queue(daemon_home)
    reply = raw_exchange(daemon_home, body)
    assert_one_line_refusal(reply)
    assert "twice in one object" in reply["error"]["message"], reply
    assert ask(daemon_home, "ping")["ok"] is True
    assert queue(daemon_home) == before


def test_an_unknown_key_beside_cmd_and_args_is_refused_by_name(daemon_home):
    """{"cmd": "ping", "user": "root"} was answered as a ping: a key the daemon ignores
    in silence is a key a client may think it obeys."""
    reply = raw_exchange(daemon_home, b'{"cmd": "ping", "as_user": "root"}')
    assert_one_line_refusal(reply)
    assert "'as_user'" in reply["error"]["message"], reply
    reply = raw_exchange(daemon_home, b'{"cmd": "list", "args": {}, "v": 2}')
    assert_one_line_refusal(reply)
    assert "'v'" in reply["error"]["message"], reply
