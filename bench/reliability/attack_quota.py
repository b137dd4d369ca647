"""One user trying to swell the daemon: held jobs up to and past `[limits] queued_jobs`,
jobs of 100 kB commands and 1 MiB environments past `queued_bytes`, 32 connections each
sending a 16 MiB frame, hundreds of idle connections to /metrics, and `ls --all --json`
of the whole queue. Each quota must refuse in one line (exit 1) with nothing queued,
cancelling must free it, other requests must go on being answered without long stalls,
and the daemon's memory, disk and threads must stay bounded."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from reliability.harness import Figures, Home, poll

# A request answered later than this counts as stalled: the CLI alone takes ~0.3 s, but
# several seconds on a 2-core box running every part at once (and 16 MiB frames decoding).
# On a box loaded by more than this (the whole test suite beside it), the bound is
# STALL_FACTOR times the same call measured just before the attack.
STALL_S = 10.0
STALL_FACTOR = 10
# Growth of the daemon's peak memory over the whole part, beyond the bytes quota's jobs
# (held in memory too): the frames' budget (32 MiB, held raw, joined and decoded) and the
# queue's bookkeeping fit under it; before the bounds, 32 frames alone took +530 MB.
RSS_GROWTH_MOST_MB = 300
FRAMES, FRAME_BYTES = 32, 16 * 2**20 - 64
METRICS_SLACK_THREADS = 8  # the daemon's own threads that may start meanwhile
# Just under limits.env: no one variable may exceed 128 KiB (the kernel's MAX_ARG_STRLEN).
BIG_ENV = {f"SWELL{i}": "v" * 110_000 for i in range(9)}
BIG_ARG = "c" * 100_000  # under limits.command


def _quotas(small: bool) -> tuple[int, int]:
    """(queued_jobs, queued_bytes in MiB): small ones for CI, else the defaults."""
    return (3000, 32) if small else (200_000, 512)


def _config(small: bool) -> str:
    jobs, size_mib = _quotas(small)
    return (
        f'[limits]\nqueued_jobs = {jobs}\nqueued_bytes = "{size_mib}MiB"\n'
        '[metrics]\nlisten = "127.0.0.1:0"\n'
    )


def _peak_rss_bytes(pid: int) -> int:
    """The process's high-water mark of resident memory (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _submit(home: Home, *args: str, env: dict | None = None) -> tuple[int, str, float, list]:
    """(exit status, stderr, seconds taken, array ids) of one held submit."""
    started = time.monotonic()
    proc = home.cli(
        "submit", "--json", "--hold", *args, "--", "true", *((BIG_ARG,) if env else ()), env=env
    )
    took = time.monotonic() - started
    ids = []
    if proc.returncode == 0:
        out = json.loads(proc.stdout)
        ids = [out.get("array_id") or out.get("id")]
    return proc.returncode, proc.stderr, took, ids


def _fill(
    home: Home, fig: Figures, key: str, chunk: list[str], most: int, env: dict | None = None
) -> list:
    """Submit chunk after chunk until the quota refuses one; the ids queued. The refusal
    must be one line, exit 1, naming the key; the queue must not hold more than `most`."""
    ids: list = []
    for _ in range(400):
        status, err, _, queued = _submit(home, *chunk, env=env)
        ids += queued
        if status:
            if (
                status != 1
                or not err.startswith("Error: ")
                or err.count("\n") != 1
                or f"limits.{key}" not in err
            ):
                fig.fail("quota_not_enforced", f"{key}: refused as {status}: {err.strip()[:200]}")
            break
    else:
        fig.fail("quota_not_enforced", f"{key}: never refused")
    held = (home.json("daemon", "status", "--json") or {}).get("pending", 0)
    fig.info[f"{key}_held"] = held
    if held > most:
        fig.fail("quota_not_enforced", f"{key}: {held} jobs held, over {most}")
    return ids


def _cancel(home: Home, fig: Figures, ids: list) -> None:
    for at in range(0, len(ids), 200):
        if home.cli("cancel", *map(str, ids[at : at + 200])).returncode:
            fig.fail("others_refused", "cancel refused")


def _others_while(home: Home, fig: Figures, what: str, attack) -> None:
    """attack() while another client submits (or asks the status) in a loop: each must
    be answered, none stalled."""
    stop, took, refused = threading.Event(), [], []

    def call() -> float:
        started = time.monotonic()
        proc = (
            home.cli("daemon", "status", "--json")
            if what == "status"
            else home.cli("submit", "--hold", "--", "true")
        )
        if proc.returncode:
            refused.append(proc.stderr.strip()[:200])
        return time.monotonic() - started

    def other() -> None:
        while not stop.is_set():
            took.append(call())

    unloaded = sorted(call() for _ in range(3))[1]
    stall_s = max(STALL_S, STALL_FACTOR * unloaded)
    thread = threading.Thread(target=other)
    thread.start()
    try:
        attack()
    finally:
        stop.set()
        thread.join()
    fig.info[f"{what}_calls_during_attack"] = len(took)
    fig.info[f"{what}_slowest_s"] = round(max(took, default=0), 2)
    for err in refused:
        fig.fail("others_refused", f"a {what} during the attack: {err}")
    stalled = [t for t in took if t > stall_s]
    if stalled:
        fig.fail(
            "others_stalled",
            f"{len(stalled)} {what} call(s) took over {stall_s:.1f} s (slowest "
            f"{max(stalled):.1f} s; {unloaded:.1f} s before the attack)",
            by=len(stalled),
        )


def _frames(path: str) -> None:
    """FRAMES connections at once, each sending one 16 MiB frame (a status with one
    huge argument: read whole before it is refused)."""
    body = b'{"cmd":"status","args":{"x":"' + b"a" * (FRAME_BYTES - 32) + b'"}}'
    frame = struct.pack(">I", len(body)) + body

    def send() -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(60)
            try:
                sock.connect(path)
                sock.sendall(frame)
                sock.recv(4)
            except OSError:
                pass  # refused, or cut off: either way not held

    with ThreadPoolExecutor(FRAMES) as pool:
        list(pool.map(lambda _: send(), range(FRAMES)))


def _metrics(home: Home, fig: Figures, daemon: psutil.Process, small: bool) -> None:
    url = (home.json("daemon", "status", "--json") or {}).get("metrics", "")
    if not url.startswith("http://"):
        fig.fail("threads", f"no /metrics to connect to: {url}")
        return
    from gpusched.daemon.observe.metricserver import MAX_CONNECTIONS

    host, port = url.split("//")[1].split("/")[0].rsplit(":", 1)
    before = daemon.num_threads()
    idle, seen = [], [before]

    def scraped() -> bool:
        seen.append(daemon.num_threads())
        try:
            with urllib.request.urlopen(url, timeout=30) as answer:
                return bool(answer.read())
        except OSError:  # all its connections held: the idle ones are closed soon
            return False

    try:
        for count in range(300 if small else 4000):
            idle.append(socket.create_connection((host, int(port)), timeout=30))
            if count % 50 == 0:  # the first are closed again before the last connect
                seen.append(daemon.num_threads())
        if not poll(scraped, 60):
            fig.fail("threads", "no scrape answered within 60 s of the idle connections")
        fig.info["threads_with_idle_metrics_connections"] = max(seen)
        if max(seen) > before + MAX_CONNECTIONS + METRICS_SLACK_THREADS:
            fig.fail(
                "threads",
                f"{max(seen)} threads with {len(idle)} idle connections (from {before})",
                by=max(seen) - before,
            )
    except OSError as exc:
        fig.fail("threads", f"/metrics: {exc}")
    finally:
        for sock in idle:
            sock.close()


def measure(small: bool) -> Figures:
    fig = Figures("one user swelling the daemon")
    fig.counts.update(
        quota_not_enforced=0,
        others_refused=0,
        others_stalled=0,
        rss_growth=0,
        disk_growth=0,
        threads=0,
    )
    home = Home("quota", config=_config(small))
    try:
        daemon = psutil.Process(home.start())
        peak_before = _peak_rss_bytes(daemon.pid)
        most_jobs, size_mib = _quotas(small)
        chunk = "0-499" if small else "0-49999"
        # Jobs: up to the quota less a few, a big listing while another submits, then past it.
        started = time.monotonic()
        ids = _fill(home, fig, "queued_jobs", ["--array", chunk], most_jobs)
        fig.info["jobs_s"] = round(time.monotonic() - started, 1)
        fig.info["peak_rss_mb_after_jobs"] = _peak_rss_bytes(daemon.pid) // 2**20
        _cancel(home, fig, ids[-1:])
        _others_while(home, fig, "submit", lambda: home.cli("ls", "--all", "--json", timeout_s=600))
        _cancel(home, fig, ids)
        if _submit(home)[0]:
            fig.fail("others_refused", "a submit after cancelling every job")
        # Bytes: 1 MiB environments, 100 kB commands.
        started, disk_before = time.monotonic(), _dir_bytes(home.state)
        ids = _fill(home, fig, "queued_bytes", ["--array", "0-3"], most_jobs, env=BIG_ENV)
        fig.info["bytes_s"] = round(time.monotonic() - started, 1)
        fig.info["peak_rss_mb_after_bytes"] = _peak_rss_bytes(daemon.pid) // 2**20
        grown_mb = (_dir_bytes(home.state) - disk_before) / 2**20
        fig.info["state_dir_growth_mb"] = round(grown_mb)
        if grown_mb > 3 * size_mib:  # the rows, and as much again in the WAL
            fig.fail("disk_growth", f"the state directory grew {grown_mb:.0f} MB")
        _cancel(home, fig, ids)
        # Large frames, while another asks the status.
        socket_path = (home.json("daemon", "status", "--json") or {}).get("socket", "")
        started = time.monotonic()
        _others_while(home, fig, "status", lambda: _frames(socket_path))
        fig.info["frames_s"] = round(time.monotonic() - started, 1)
        fig.info["peak_rss_mb_after_frames"] = _peak_rss_bytes(daemon.pid) // 2**20
        started = time.monotonic()
        _metrics(home, fig, daemon, small)
        fig.info["metrics_s"] = round(time.monotonic() - started, 1)
        growth_mb = (_peak_rss_bytes(daemon.pid) - peak_before) / 2**20
        fig.info["daemon_peak_rss_growth_mb"] = round(growth_mb)
        if growth_mb > RSS_GROWTH_MOST_MB + size_mib:
            fig.fail("rss_growth", f"the daemon's peak memory grew {growth_mb:.0f} MB")
        if poll(lambda: home.daemon_pid() == daemon.pid, 10) is None:
            fig.fail("others_refused", "the daemon is gone")
    finally:
        home.close()
    return fig
