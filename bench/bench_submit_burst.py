"""The daemon's capacity for durable submits: many clients at once, each speaking the
protocol itself (no CLI start-up), and nothing acknowledged lost to a SIGKILL mid-burst.

100 submitters (processes forked from this one, a connection each) send 100 submits each, one
after another; a submit counts once its reply came, which the daemon sends only after the
commit (and fsync) that stored it. The jobs are held, so that running them takes no core
from the daemon. Then a second burst is cut short by SIGKILLing the daemon; a new daemon
must list every job whose submit was acknowledged. task-spooler's figure is beside it: the
same number of `tsp` calls from as many threads (its client is the only way to queue).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

from common import TSP, Gpusched, TaskSpooler, print_table, ratio, scratch_dir

TARGET_PER_S = 2000.0


class Connection:
    """One client's connection, speaking the wire format (length-prefixed JSON) itself."""

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(300)
        self.sock.connect(path)
        self.stream = self.sock.makefile("rb")

    def call(self, cmd: str, **args: object) -> dict:
        body = json.dumps({"cmd": cmd, "args": args}).encode()
        self.sock.sendall(struct.pack(">I", len(body)) + body)
        header = self.stream.read(4)
        if len(header) < 4:
            raise ConnectionError("the daemon closed the connection")
        (size,) = struct.unpack(">I", header)
        reply = json.loads(self.stream.read(size))
        if not reply.get("ok"):
            raise RuntimeError(f"gpusched {cmd}: {reply.get('error')}")
        return reply["result"]

    def close(self) -> None:
        self.stream.close()
        self.sock.close()


def _no() -> None:
    pass


def burst(
    socket_path: str, clients: int, each: int, kill_at: int = 0, kill: Callable[[], None] = _no
) -> tuple[float, list[int]]:
    """clients processes (forked: no start-up), each submitting `each` held jobs on a
    connection of its own; kill() once kill_at submits were acknowledged (0: never).
    Returns the seconds from the first submit to the last reply, and the ids acknowledged."""
    cwd = str(scratch_dir())
    spec = {"command": ["true"], "hold": True}
    forked = multiprocessing.get_context("fork")
    ready = forked.Barrier(clients + 1)
    count = forked.Value("i", 0)  # acknowledged so far
    replies = forked.SimpleQueue()

    def client() -> None:
        mine: list[int] = []
        conn = Connection(socket_path)
        ready.wait()
        try:
            for _ in range(each):
                mine.extend(conn.call("submit", jobs=[spec], cwd=cwd)["ids"])
                with count.get_lock():
                    count.value += 1
        except (OSError, ConnectionError):
            pass  # the daemon was killed: this submit was never acknowledged
        finally:
            conn.close()
            replies.put(mine)

    def killer() -> None:
        while count.value < kill_at:
            time.sleep(0.001)
        kill()

    procs = [forked.Process(target=client) for _ in range(clients)]
    for proc in procs:
        proc.start()
    watcher = threading.Thread(target=killer, daemon=True)
    if kill_at:
        watcher.start()
    ready.wait()
    started = time.perf_counter()
    acked = [job_id for _ in procs for job_id in replies.get()]
    seconds = time.perf_counter() - started
    for proc in procs:
        proc.join()
    return seconds, acked


def tsp_burst(clients: int, each: int) -> float:
    """The same number of `tsp true` calls from as many threads: seconds for all."""
    with TaskSpooler(slots=1) as ts:
        go = threading.Barrier(clients + 1)

        def client() -> None:
            go.wait()
            for _ in range(each):
                ts.submit("true")

        threads = [threading.Thread(target=client) for _ in range(clients)]
        for thread in threads:
            thread.start()
        go.wait()
        started = time.perf_counter()
        for thread in threads:
            thread.join()
        return time.perf_counter() - started


def killed_mid_burst(clients: int, each: int) -> tuple[int, int]:
    """A burst cut by SIGKILL once about half was acknowledged: (acknowledged, of them
    missing from a new daemon's queue)."""
    with Gpusched(simulate="4x80GiB") as gs:
        pid = gs.pid
        assert pid is not None
        _, acked = burst(gs.socket, clients, each, clients * each // 2, lambda: os.kill(pid, 9))
        gs.cli("daemon", "start")
        gs.pid = json.loads(gs.cli("daemon", "status", "--json"))["pid"]
        listed = {job["id"] for job in json.loads(gs.cli("ls", "--all", "--json"))}
        return len(acked), len(set(acked) - listed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--each", type=int, default=100, help="submits per client")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tsp-each", type=int, default=10, help="tsp calls per client")
    args = parser.parse_args(argv)
    total = args.clients * args.each

    rates = []
    for _ in range(args.rounds):
        with Gpusched(simulate="4x80GiB") as gs:
            seconds, acked = burst(gs.socket, args.clients, args.each)
            assert len(acked) == total, f"{len(acked)} of {total} acknowledged"
            rates.append(total / seconds)
    tsp_rates: list[float] = []
    if Path(TSP).exists() or _on_path(TSP):
        for _ in range(args.rounds):
            tsp_total = args.clients * args.tsp_each
            tsp_rates.append(tsp_total / tsp_burst(args.clients, args.tsp_each))
    acknowledged, lost = killed_mid_burst(args.clients, args.each)

    ours = statistics.median(rates)
    peer = statistics.median(tsp_rates) if tsp_rates else 0.0
    print_table(
        f"durable submits, {args.clients} clients x {args.each}, medians of {args.rounds}",
        ("scheduler", "submits/s", "rounds", "vs tsp", "target"),
        [
            (
                "gpusched (protocol)",
                f"{ours:,.0f}",
                ", ".join(f"{r:,.0f}" for r in rates),
                ratio(ours, peer) if peer else "n/a",
                f">= {TARGET_PER_S:,.0f}/s: {'ok' if ours >= TARGET_PER_S else 'MISSED'}",
            ),
            (
                f"tsp ({args.tsp_each} calls per client)",
                f"{peer:,.0f}" if peer else "not installed",
                ", ".join(f"{r:,.0f}" for r in tsp_rates),
                "",
                "",
            ),
        ],
    )
    print(
        f"SIGKILL mid-burst: {acknowledged:,} submits acknowledged, {lost} of them missing "
        f"after the restart ({'ok' if lost == 0 else 'LOST'})"
    )
    return 0 if lost == 0 else 1


def _on_path(name: str) -> bool:
    return any(os.access(os.path.join(d, name), os.X_OK) for d in os.environ["PATH"].split(":"))


if __name__ == "__main__":
    raise SystemExit(main())
