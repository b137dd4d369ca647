"""The wire: framing limits, the command table, read timeouts, peer credentials, socket modes."""

from __future__ import annotations

import json
import os
import pwd
import socket
import stat
import struct
import subprocess
import sys
import threading
import time

import pytest

from conftest import Home
from gpusched.client import protocol, wire
from gpusched.core.errors import ProtocolError
from gpusched.daemon.requests.server import SocketServer

HEADER = struct.Struct(">I")


def frame(body: bytes) -> bytes:
    return HEADER.pack(len(body)) + body


# -- framing, in process -------------------------------------------------------------------
@pytest.fixture
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.settimeout(10)
    b.settimeout(10)
    yield a, b
    a.close()
    b.close()


def test_round_trip(pair):
    a, b = pair
    message = {"cmd": "submit", "args": {"jobs": [{"command": ["echo", "é ✓"]}]}}
    protocol.send(a, message)
    protocol.send(a, {"cmd": "ping"})
    assert protocol.receive(b) == message
    assert protocol.receive(b) == {"cmd": "ping"}
    a.close()
    assert protocol.receive(b) is None  # a clean close between frames


def test_a_frame_is_length_prefixed_json(pair):
    a, b = pair
    a.sendall(frame(b'{"cmd":"ping"}'))
    assert protocol.receive(b) == {"cmd": "ping"}
    assert protocol.encode({"x": 1}) == frame(b'{"x":1}')


def test_frames_over_the_cap_are_refused_both_ways(pair, monkeypatch):
    monkeypatch.setattr(wire, "MAX_FRAME_BYTES", 1000)
    with pytest.raises(ProtocolError, match="over the 1000-byte limit"):
        protocol.encode({"blob": "x" * 1000})
    a, b = pair
    a.sendall(HEADER.pack(1001))  # only the header: the body must never be read
    with pytest.raises(ProtocolError, match="1001 bytes is over the 1000-byte limit"):
        protocol.receive(b)
    protocol.encode({"blob": "x" * 900})  # under the cap is fine


def test_truncated_frame(pair):
    a, b = pair
    a.sendall(HEADER.pack(100) + b'{"cmd": "pi')
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(ProtocolError, match="closed in the middle"):
        protocol.receive(b)


def test_truncated_header(pair):
    a, b = pair
    a.sendall(b"\x00\x00")
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(ProtocolError, match="closed in the middle"):
        protocol.receive(b)


@pytest.mark.parametrize(
    "body, match",
    [
        (b"not json at all", "not JSON"),
        (b"\xff\xfe\x00", "not JSON"),
        (b"[1, 2, 3]", "not a JSON object"),
        (b'"ping"', "not a JSON object"),
    ],
)
def test_non_json_and_non_objects(pair, body, match):
    a, b = pair
    a.sendall(frame(body))
    with pytest.raises(ProtocolError, match=match):
        protocol.receive(b)


# -- the command table ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "message, match",
    [
        ({"cmd": "frobnicate"}, "unknown command 'frobnicate'; known: "),
        ({"cmd": 3}, "'cmd' string"),
        ({"args": {}}, "'cmd' string"),
        (["ping"], "JSON object"),
        ({"cmd": "show", "args": {}}, r"'show': missing \['ids'\], unexpected \[\]"),
        ({"cmd": "ping", "args": {"x": 1}}, r"unexpected \['x'\]"),
        ({"cmd": "submit", "args": {"jobs": [], "uid": 0}}, r"unexpected \['uid'\]"),
        ({"cmd": "show", "args": [1]}, "args must be a JSON object"),
    ],
)
def test_requests_are_checked_against_the_table(message, match):
    with pytest.raises(ProtocolError, match=match):
        protocol.check_request(message)


def test_unknown_command_lists_the_known_ones():
    with pytest.raises(ProtocolError) as info:
        protocol.check_request({"cmd": "nope"})
    assert all(name in info.value.message for name in protocol.COMMANDS)


def test_valid_requests_pass():
    assert protocol.check_request({"cmd": "ping"}) == ("ping", {})
    assert protocol.check_request({"cmd": "wait", "args": {"ids": [1], "timeout_s": 2}}) == (
        "wait",
        {"ids": [1], "timeout_s": 2},
    )


def test_peer_credentials_come_from_the_kernel(pair):
    _a, b = pair
    assert protocol.peer_credentials(b) == (os.getpid(), os.getuid(), os.getgid())


# -- the read timeout, on a real socket server in this process -----------------------------
def test_a_silent_client_is_disconnected_and_others_are_served(tmp_path, monkeypatch):
    monkeypatch.setattr(protocol, "READ_TIMEOUT_S", 0.3)
    server = SocketServer(tmp_path / "s.sock", lambda name, args, creds: {"pid": creds[0]})
    server.start()
    try:
        silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        partial = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        for s in (silent, partial):
            s.settimeout(30)
            s.connect(str(tmp_path / "s.sock"))
        partial.sendall(HEADER.pack(50) + b'{"cmd"')  # starts a frame and stalls
        # While both stall, another client is answered at once.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:
            other.settimeout(30)
            other.connect(str(tmp_path / "s.sock"))
            protocol.send(other, {"cmd": "ping"})
            assert protocol.receive(other) == {"ok": True, "result": {"pid": os.getpid()}}
        # ... and the stalled ones are cut off after the read timeout.
        started = time.monotonic()
        assert silent.recv(1) == b""
        assert partial.recv(1) == b""
        assert time.monotonic() - started < 20
        silent.close()
        partial.close()
    finally:
        server.close()
    assert not (tmp_path / "s.sock").exists()


def test_answers_given_while_stopping_still_go_out(tmp_path):
    # `daemon stop`: the loop answers, then the daemon exits at once. drain() must let the
    # connection thread send that answer first (threads die with the process), and must not
    # wait out the read timeout of a client that sends nothing.
    answer_now = threading.Event()
    entered = threading.Event()

    def dispatch(name, args, creds):
        entered.set()
        answer_now.wait(30)
        return {"stopping": True}

    server = SocketServer(tmp_path / "s.sock", dispatch)
    server.start()
    idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    asking = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        for s in (idle, asking):
            s.settimeout(30)
            s.connect(str(tmp_path / "s.sock"))
        protocol.send(asking, {"cmd": "stop"})
        assert entered.wait(30)
        server.close()
        answer_now.set()
        started = time.monotonic()
        server.drain(timeout_s=5)
        assert time.monotonic() - started < protocol.READ_TIMEOUT_S
        asking.settimeout(0)  # already sent: no waiting allowed
        assert protocol.receive(asking) == {"ok": True, "result": {"stopping": True}}
        assert idle.recv(1) == b""  # woken and closed, not left to time out
    finally:
        answer_now.set()
        idle.close()
        asking.close()


def test_a_stale_socket_file_is_replaced(tmp_path):
    path = tmp_path / "s.sock"
    path.write_text("stale")
    server = SocketServer(path, lambda *a: None)
    try:
        assert stat.S_ISSOCK(path.stat().st_mode)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    finally:
        server.close()


# -- against a real daemon -----------------------------------------------------------------
def exchange(home, data: bytes, half_close: bool = False) -> dict | None:
    """Send raw bytes to the home's daemon and read one reply frame."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(home.path / "run" / "gpusched.sock"))
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        return protocol.receive(sock)


def assert_protocol_error(reply: dict | None, words: str) -> None:
    assert reply is not None and reply["ok"] is False
    assert reply["error"]["kind"] == "protocol"
    assert words in reply["error"]["message"]


@pytest.fixture(scope="module")
def daemon_home(tmp_path_factory):
    """One real daemon for the wire tests: none of them changes what the others see."""
    home = Home(tmp_path_factory.mktemp("protocol") / "home")
    home.path.mkdir()
    home.pid = home.start()
    yield home
    home.cleanup()


@pytest.fixture
def running(daemon_home):
    yield daemon_home
    # Whatever a test sent, the daemon is the same one and still answers.
    assert exchange(daemon_home, frame(b'{"cmd": "ping"}')) == {
        "ok": True,
        "result": {"pid": daemon_home.pid},
    }


@pytest.mark.e2e
def test_daemon_refuses_an_oversized_frame_without_reading_it(running):
    reply = exchange(running, HEADER.pack(protocol.MAX_FRAME_BYTES + 1))
    assert_protocol_error(reply, "over the")


@pytest.mark.e2e
def test_daemon_refuses_a_truncated_frame(running):
    reply = exchange(running, HEADER.pack(200) + b'{"cmd": "st', half_close=True)
    assert_protocol_error(reply, "closed in the middle")


@pytest.mark.e2e
def test_daemon_refuses_non_json(running):
    assert_protocol_error(exchange(running, frame(b"\x00garbage{")), "not JSON")


@pytest.mark.e2e
def test_daemon_refuses_an_unknown_command(running):
    reply = exchange(running, frame(json.dumps({"cmd": "rm_rf", "args": {}}).encode()))
    assert_protocol_error(reply, "unknown command 'rm_rf'")


@pytest.mark.e2e
def test_daemon_checks_args_against_the_table(running):
    before = running.jobs()
    jobs = [{"command": ["true"]}]
    # A client cannot claim an identity: there is no such argument.
    reply = exchange(
        running,
        frame(
            json.dumps(
                {"cmd": "submit", "args": {"jobs": jobs, "cwd": "/", "uid": 0, "user": "root"}}
            ).encode()
        ),
    )
    assert_protocol_error(reply, "unexpected ['uid', 'user']")
    assert_protocol_error(
        exchange(running, frame(b'{"cmd": "cancel", "args": {}}')), "missing ['ids']"
    )
    assert running.jobs() == before


@pytest.mark.e2e
def test_daemon_serves_others_while_a_client_stalls(running):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.connect(str(running.path / "run" / "gpusched.sock"))
        silent.sendall(HEADER.pack(100))  # half a request, then nothing
        started = time.monotonic()
        assert running.run("ls").returncode == 0
        assert exchange(running, frame(b'{"cmd": "ping"}'))["ok"] is True
        # Served at once, not after the stalled client's read timeout.
        assert time.monotonic() - started < protocol.READ_TIMEOUT_S


@pytest.mark.e2e
def test_submitter_uid_and_pid_are_recorded(running):
    home = running
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpusched", "submit", "--json", "--", "true"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=home.env,
        cwd=home.path,
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    job = home.show(json.loads(out)["id"])
    assert job["uid"] == os.getuid()
    assert job["user"] == pwd.getpwuid(os.getuid()).pw_name
    assert job["submit_pid"] == proc.pid


@pytest.mark.e2e
def test_socket_is_0600_in_a_0700_directory(running):
    sock = running.path / "run" / "gpusched.sock"
    assert stat.S_ISSOCK(sock.stat().st_mode)
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(running.state.stat().st_mode) == 0o700
    assert sock.stat().st_uid == os.getuid()
