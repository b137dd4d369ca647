"""Bad lines on a service's request log (the UDP port its front door logs requests to),
sent by another process: Unicode digits, garbage, huge datagrams, lines without the
service's secret or with another; then a flood of good lines. None may abort a step of
the service's manager, freeze the service, count as a request, or grow the daemon."""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil

from reliability.harness import Figures, Home, poll

SERVER = Path(__file__).resolve().parents[2] / "tests" / "svcserver.py"
HEADER = b"<134>Dec  2 18:30:00 haproxy[42]: "
# The window of latencies holds 10,000: a second flood must not grow the daemon.
RSS_GROWTH_MOST_MB = 4
# Sends each datagram of the file named by argv[2], one per line ("x" and hex), argv[3] times,
# to 127.0.0.1:argv[1]; or for argv[4] seconds, as fast as it can.
SENDER = """
import socket, sys, time
port, rounds, seconds = int(sys.argv[1]), int(sys.argv[3]), float(sys.argv[4])
messages = [bytes.fromhex(h[1:]) for h in open(sys.argv[2]).read().split()]
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sent, end = 0, time.monotonic() + seconds
while sent < rounds or time.monotonic() < end:
    for m in messages:
        try:
            sock.sendto(m, ("127.0.0.1", port))
        except OSError:  # a full buffer: the next one
            pass
    sent += 1
print(sent * len(messages))
"""


def bad_lines(token: str) -> dict[str, bytes]:
    """(class, datagram): each one refused, none stops a step."""
    return {
        "unicode digit in the latency": HEADER + f" {token} ² 200 r1\n".encode(),
        "unicode digits in the status": HEADER + f" {token} 12 2٠٠ r1\n".encode(),
        "garbage bytes": b"\xff\xfe\x00" * 100,
        "empty": b"",
        "huge line": HEADER + b"x" * 60000 + f" {token} 12 200 r1\n".encode(),
        "float latency": HEADER + f" {token} 1e9 200 r1\n".encode(),
        **spoofed(),
    }


def spoofed() -> dict[str, bytes]:
    """(class, datagram): well formed, but not from the service's front door."""
    return {
        "no secret (anyone's fake latency)": HEADER + b"5000 200 r1\n",
        "another secret": HEADER + f" {secrets.token_hex(16)} 5000 200 r1\n".encode(),
    }


def _send(home: Home, port: int, messages: list[bytes], rounds: int, seconds: float) -> int:
    """Sent by another process; how many datagrams it sent."""
    listing = home.path / "datagrams.hex"
    listing.write_text("".join(f"x{m.hex()}\n" for m in messages))
    done = subprocess.run(
        [sys.executable, "-c", SENDER, str(port), str(listing), str(rounds), str(seconds)],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
    )
    return int(done.stdout or 0)


def _config(home: Home) -> tuple[int, str]:
    text = (home.state / "services" / "door.haproxy.cfg").read_text()
    port = int(re.search(r"log 127\.0\.0\.1:(\d+)", text)[1])
    token = re.search(r'log-format "([0-9a-f]{32}) ', text)
    return port, token[1] if token else ""


def _show(home: Home) -> dict | None:
    return home.json("service", "show", "door", "--json")


def _spoof(home: Home, fig: Figures, port: int, listen: str, rounds: int) -> None:
    """Fake requests, then real ones: only the real ones count."""
    before = (_show(home) or {}).get("requests_total", 0)
    fig.info["spoofed_lines_sent"] = _send(home, port, list(spoofed().values()), rounds, 0.0)
    served = 0
    for _ in range(10):
        try:
            with urllib.request.urlopen(f"http://{listen}/", timeout=30) as answer:
                served += answer.status == 200
        except OSError:
            pass
    fig.info["requests_served"] = served
    counted = poll(lambda: (s := _show(home)) and s["requests_total"] >= before + served and s)
    taken = (counted or {}).get("requests_total", before + served) - before - served
    if taken:
        fig.fail(
            "spoofed_lines_taken",
            f"{taken} request(s) counted beyond the {served} served",
            by=taken,
        )
    fig.info["log_lines_refused"] = (counted or {}).get("log_lines_refused")


def _flood(home: Home, fig: Figures, port: int, token: str, small: bool) -> None:
    """Good lines (with the secret, as the front door sends them) as fast as they go, in
    two rounds: the daemon may grow in the first (its buffers), not in the second."""
    flood = [HEADER + f" {token} {i % 900} 200 r1\n".encode() for i in range(50)]
    seconds = 4.0 if small else 30.0
    daemon = psutil.Process(home.daemon_pid())
    sent = counted = 0
    for _ in range(2):
        rss_before = daemon.memory_info().rss
        total = (_show(home) or {}).get("requests_total", 0)
        sent += _send(home, port, flood, 0, seconds)
        settled = poll(lambda: (s := _show(home)) and s["requests_total"] > total and s)  # noqa: B023 - called within this turn of the loop
        counted += (settled or {}).get("requests_total", total) - total
    growth_mb = (daemon.memory_info().rss - rss_before) / 2**20
    fig.info.update(
        flood_lines_sent=sent,
        flood_lines_counted=counted,
        daemon_rss_growth_mb_second_flood=round(growth_mb, 1),
    )
    if growth_mb > RSS_GROWTH_MOST_MB:
        fig.fail("window_growth", f"the daemon grew {growth_mb:.0f} MB in the second flood")


def measure(small: bool) -> Figures:
    fig = Figures("bad request-log lines")
    if not shutil.which("haproxy") and not shutil.which("haproxy", path="/usr/sbin"):
        fig.skipped = "HAProxy is not installed"
        return fig
    fig.counts.update(steps_aborted=0, services_frozen=0, spoofed_lines_taken=0, window_growth=0)
    home = Home("requestlog")
    try:
        home.start()
        created = home.json(
            "service",
            "create",
            "door",
            "--json",
            "--replicas",
            "0",
            "--",
            sys.executable,
            str(SERVER),
        )
        port, token = _config(home)
        rounds = 200 if small else 2000
        classes = bad_lines(token)
        fig.info["classes"] = len(classes)
        fig.info["bad_lines_sent"] = _send(home, port, list(classes.values()), rounds, 0.0)
        # The manager goes on: the replica asked for now is queued and let in.
        home.cli("service", "scale", "door", "1")
        if not poll(lambda: (s := _show(home)) and s["running"] == 1):
            fig.fail("services_frozen", "no replica ready within 60 s after the bad lines")
        _spoof(home, fig, port, created["listen"], rounds)
        _flood(home, fig, port, token, small)
        aborted = home.log.read_text(errors="replace").count("a step failed")
        if aborted:
            fig.fail("steps_aborted", "the manager's step raised on a line", by=aborted)
    finally:
        home.close()
    return fig
