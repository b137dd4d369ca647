"""The daemon's connection threads wait in accept() themselves: a request is taken by a
thread already waiting, not by one started for it (which cost every command about a
third of a millisecond), and more are started while every one is busy, so that clients
held in a long `wait` never keep others out. On a real socket server in this process."""

from __future__ import annotations

import socket
import threading

from conftest import wait_until
from gpusched.client import protocol
from gpusched.daemon.requests.server import FIRST_THREADS, SPARE_THREADS, SocketServer


def _ask(path, cmd: str = "gpus") -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(path))
        protocol.send(sock, {"cmd": cmd})
        return protocol.receive(sock)


def _held(path) -> socket.socket:
    """A connection whose `status` request dispatch holds (as the loop holds a `wait`)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(str(path))
    protocol.send(sock, {"cmd": "status"})
    return sock


def test_requests_one_after_another_are_served_by_the_same_few_threads(tmp_path):
    served_by: list[threading.Thread] = []  # kept alive: no two threads can look alike

    def dispatch(name, args, creds):
        served_by.append(threading.current_thread())
        return name

    server = SocketServer(tmp_path / "s.sock", dispatch)
    server.start()
    try:
        for _ in range(40):
            assert _ask(tmp_path / "s.sock") == {"ok": True, "result": "gpus"}
            # Each thread back in accept() before the next request (on a loaded machine
            # one may not be yet, and another waiting thread takes the request).
            wait_until(lambda: server._idle == FIRST_THREADS, "the thread to go back to accept()")
    finally:
        server.close()
    assert len(served_by) == 40
    assert len(set(served_by)) <= FIRST_THREADS  # a thread per connection made 40


def test_every_held_connection_gets_a_thread_and_the_extra_ones_end(tmp_path):
    release = threading.Event()
    inside = []

    def dispatch(name, args, creds):
        if name == "status":  # held, as a `wait` is (whose arguments need job ids)
            inside.append(threading.current_thread())
            release.wait(30)
        return name

    path = tmp_path / "s.sock"
    server = SocketServer(path, dispatch)
    server.start()
    waiting = []
    try:
        waiting += [_held(path) for _ in range(12)]
        wait_until(lambda: len(inside) == 12, "every held request to reach dispatch")
        assert _ask(path) == {"ok": True, "result": "gpus"}  # others are still served
        release.set()
        for sock in waiting:
            assert protocol.receive(sock) == {"ok": True, "result": "status"}
            sock.close()
        # The threads the held requests needed end, but for a few that keep waiting.
        wait_until(
            lambda: sum(t.is_alive() for t in inside) <= SPARE_THREADS,
            "the extra connection threads to end",
        )
        assert _ask(path) == {"ok": True, "result": "gpus"}
    finally:
        release.set()
        for sock in waiting:
            sock.close()
        server.close()


def test_where_no_thread_can_start_the_threads_there_serve_on(tmp_path, monkeypatch):
    release = threading.Event()
    path = tmp_path / "s.sock"

    def dispatch(name, args, creds):
        if name == "status":
            release.wait(30)
        return name

    server = SocketServer(path, dispatch)
    server.start()  # its FIRST_THREADS threads

    def refuse(thread):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)  # a limit on threads, from now on
    held = []
    try:
        held += [_held(path) for _ in range(FIRST_THREADS)]  # every thread busy, none added
        wait_until(lambda: len(server._open) == FIRST_THREADS, "both threads to be serving")
        release.set()
        for sock in held:  # each answered, though no thread could be added for it
            assert protocol.receive(sock) == {"ok": True, "result": "status"}
            sock.close()
        # ... and the threads go back to accept() for the next requests.
        assert _ask(path) == {"ok": True, "result": "gpus"}
        assert _ask(path) == {"ok": True, "result": "gpus"}
    finally:
        release.set()
        for sock in held:
            sock.close()
        server.close()
