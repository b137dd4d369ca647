"""The request log a service's front door sends to the daemon: only lines with the
service's secret count, a bad line is dropped and never stops a step of the service's
manager, and a flood of good lines keeps the daemon's window bounded."""

from __future__ import annotations

import os
import re
import socket
import threading

from conftest import wait_until
from gpusched.daemon.services import frontdoor
from gpusched.daemon.services.frontdoor import Door
from gpusched.proc.haproxy import new_token, parse_line
from services_util import ask, create, needs_haproxy, show, wait_ready

TOKEN = "0123456789abcdef" * 2
# As HAProxy sends it (RFC 3164 header, then the log-format).
GOOD = f"<134>Dec  2 18:30:00 haproxy[42]: {TOKEN} 12 200 r5\n".encode()


def test_a_line_counts_only_whole_with_its_secret_and_ascii_digits():
    assert parse_line(GOOD, TOKEN) == (12.0, 200, "r5")
    assert parse_line(GOOD.replace(b" 200 ", b" -1 "), TOKEN) == (12.0, -1, "r5")
    bad = [
        GOOD.replace(TOKEN.encode(), new_token().encode()),  # another secret
        b"<134>haproxy[1]: 5000 200 r1\n",  # no secret: the old format, from anyone
        GOOD.replace(b" 12 ", " ² ".encode()),  # '²'.isdigit() is true
        GOOD.replace(b" 200 ", " 2٠٠ ".encode()),  # Arabic-Indic zeros
        GOOD.replace(b" 12 ", b" 1e9 "),
        GOOD.replace(b" 12 ", b" 99999999999 "),
        GOOD + b"x" * 3000,
        b"\xff\xfe" * 2000,
        b"",
        b"garbage",
    ]
    for message in bad:
        assert parse_line(message, TOKEN) is None, message


class Flood:
    """A request log that hands the door `count` good lines at each read."""

    def __init__(self, count: int):
        self.count, self.refused = count, 0

    def read(self) -> list[tuple[float, int, str]]:
        return [(float(i % 300), 200, "r1") for i in range(self.count)]


def test_a_flood_of_good_lines_keeps_the_window_of_latencies_bounded(tmp_path):
    door = Door(str(tmp_path), "web", str(tmp_path))
    door.requests = Flood(50_000)
    now = 1_700_000_000.0
    for step in range(8):  # 400,000 requests within two seconds
        door.take_requests(now + step * 0.25)
    assert door.requests_total == 400_000
    assert len(door.latencies) <= frontdoor._LATENCIES_MOST
    assert len(door.counted) == 8
    summary = door.summary(now + 2.0)
    assert summary["requests_per_s"] == round(400_000 / 60, 3)


def _log_port(home, name: str) -> int:
    config = (home.path / "state" / "services" / f"{name}.haproxy.cfg").read_text()
    return int(re.search(r"log 127\.0\.0\.1:(\d+)", config)[1])


class Sender:
    """Datagrams sent to the request log's port, round after round, until stopped."""

    def __init__(self, port: int, messages: list[bytes]):
        self.port, self.messages, self.sent = port, messages, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            while not self._stop.wait(0.01):
                for message in self.messages:
                    sock.sendto(message, ("127.0.0.1", self.port))
                    self.sent += 1

    def __enter__(self) -> Sender:
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


@needs_haproxy
def test_bad_or_foreign_request_log_lines_neither_stop_the_service_nor_count(home):
    created = create(home, "door", "--replicas", "0")
    messages = [
        "<134>haproxy[1]: ² 200 r1\n".encode(),
        b"garbage",
        b"x" * 4000,
        b"<134>haproxy[1]: 5000 200 r1\n",
        b"<134>haproxy[1]: -1 503 r1\n",
    ]
    with Sender(_log_port(home, "door"), messages) as sender:
        wait_until(lambda: sender.sent >= 50, "bad lines sent")
        # The manager's steps go on: the replica asked for is queued and let in.
        home.run("service", "scale", "door", "1")
        wait_ready(home, "door", 1)
        for _ in range(5):
            assert ask(created["listen"], "/")[0] == 200
        shown = wait_until(
            lambda: (s := show(home, "door"))["requests_total"] >= 5 and s,
            "the front door's own lines to count",
        )
    assert shown["requests_total"] == 5 and shown["failed_total"] == 0
    assert shown["log_lines_refused"] >= 50
    log = (home.path / "state" / "daemon.log").read_text()
    assert "a step failed" not in log


def test_a_restarted_daemon_reads_the_secret_of_a_running_door_from_its_config(tmp_path):
    door = Door(str(tmp_path), "web", str(tmp_path))
    door.proxy.write_config("127.0.0.1:8080", "roundrobin", "", 0, TOKEN, None)
    door.open_log()
    try:
        assert door.requests.token == TOKEN
    finally:
        door.close()


def test_a_log_port_taken_while_the_daemon_was_away_restarts_the_door(tmp_path):
    """Whoever holds the port would read the door's lines and its secret."""
    door = Door(str(tmp_path), "web", str(tmp_path))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taker:
        taker.bind(("127.0.0.1", 0))
        taken = taker.getsockname()[1]
        door.proxy.write_config("127.0.0.1:8080", "roundrobin", "", taken, TOKEN, None)
        door.open_log()
        try:
            assert door.requests.port != taken
            assert not os.path.exists(door.proxy.config_path)  # stopped: started anew
        finally:
            door.close()


def test_a_door_of_an_older_gpusched_without_a_secret_is_started_anew(tmp_path):
    door = Door(str(tmp_path), "web", str(tmp_path))
    door.proxy.write_config("127.0.0.1:8080", "roundrobin", "", 0, TOKEN, None)
    config = open(door.proxy.config_path).read()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    older = config.replace(f"{TOKEN} ", "").replace("127.0.0.1:0", f"127.0.0.1:{port}")
    open(door.proxy.config_path, "w").write(older)
    door.open_log()
    try:
        assert not os.path.exists(door.proxy.config_path)
    finally:
        door.close()
