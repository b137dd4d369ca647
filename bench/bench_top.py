"""`gpusched top`: the cost of one frame, and the CPU the live view takes at a 1 s interval.

render: one frame for 8 GPUs, 60 processes and 1,000 queued jobs, rendered to ANSI text
as Live would (140x50), against rich Tables in Panels holding as many rows; and the
--once frame (every row) against rich's own Table of the same 1,000 jobs, in the same
run. Target: a live frame's median <= 10 ms (issue 15).

cpu: `gpusched top --interval 1` in a pseudo-terminal (140x50) for --seconds against a
daemon on 8 simulated GPUs holding 8 running and 992 pending jobs, with 52 outside
processes; its CPU time (psutil, before/after) as % of one core, against the idle
daemon's CPU over as long a window just before top starts. Target: <= 1% (issue 15).
Top asks for the pending jobs again only when they changed (`pending_version`), so a
quiet queue of 1,000 costs one read, not one a second.
"""

from __future__ import annotations

import argparse
import fcntl
import io
import json
import os
import pty
import signal
import struct
import subprocess
import tempfile
import termios
import threading
import time
from pathlib import Path
from types import MappingProxyType

import psutil
from common import Gpusched, gpusched_script, median_ms, print_table, ratio, verdict
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table

from gpusched.core.models import GpuInfo, GpuProcess, Inventory
from gpusched.tui.model import DaemonInfo, HostInfo, ProcHost, Snapshot, TopJob, ViewState
from gpusched.tui.render import render, to_text

FRAME_TARGET_MS = 10.0
CPU_TARGET_PCT = 1.0
COLUMNS, LINES = 140, 50
GIB = 2**30


def synthetic_snapshot(gpu_count: int = 8, proc_count: int = 60, job_count: int = 1000) -> Snapshot:
    now = 1_700_000_000.0
    procs_by_gpu: dict[int, list[GpuProcess]] = {i: [] for i in range(gpu_count)}
    proc_host = {}
    for n in range(proc_count):
        gpu = n % gpu_count
        procs_by_gpu[gpu].append(
            GpuProcess(
                pid=10_000 + n,
                gpu_uuid=f"GPU-{gpu}",
                used_mem_bytes=(n % 7 + 1) * GIB,
                user=f"user{n % 5}",
                command=f"python train.py --run {n} --lr 3e-4",
            )
        )
        proc_host[10_000 + n] = ProcHost(
            cpu_pct=float(n % 100), rss_bytes=n * 2**26, started_at=now - 60 * n
        )
    gpus = tuple(
        GpuInfo(
            index=i,
            uuid=f"GPU-{i}",
            name="NVIDIA H100 80GB HBM3",
            mem_total_bytes=80 * GIB,
            mem_used_bytes=(10 + 8 * i) * GIB,
            util_pct=float(12 * i),
            bus_id=f"00000000:{0x18 + 16 * i:02X}:00.0",
            temperature_c=40 + i,
            power_w=100.0 + 50 * i,
            power_limit_w=700.0,
            processes=tuple(procs_by_gpu[i]),
        )
        for i in range(gpu_count)
    )
    jobs = tuple(
        TopJob(
            id=n,
            name=f"job-{n}",
            user=f"user{n % 5}",
            uid=1000 + n % 5,
            state="running" if n < gpu_count else "pending",
            gpu_indices=(n,) if n < gpu_count else (),
            gpus_requested=1,
            gpu_mem_bytes=None if n % 2 else 20 * GIB,
            priority=n % 3,
            command=("python", "train.py", f"--seed={n}"),
            submitted_at=now - 5 * n,
            started_at=now - 100 if n < gpu_count else None,
            pending_reason="" if n < gpu_count else "waiting for a free GPU (8 busy)",
        )
        for n in range(job_count)
    )
    return Snapshot(
        now=now,
        inventory=Inventory(gpus=gpus, backend="nvml", driver_version="550", cuda_version="12.4"),
        host=HostInfo("bench", 12.0, 100 * GIB, 256 * GIB, (1.0, 1.0, 1.0)),
        daemon=DaemonInfo(1, 100.0, "0.1.0"),
        jobs=jobs,
        pid_jobs=MappingProxyType({10_000 + n: n for n in range(gpu_count)}),
        proc_host=MappingProxyType(proc_host),
    )


def _console(height: int | None) -> Console:
    return Console(
        file=io.StringIO(),
        width=COLUMNS,
        height=height or 10_000,
        force_terminal=True,
        color_system="truecolor",
        legacy_windows=False,
        _environ={},
    )


def time_frame(snapshot: Snapshot, height: int | None) -> float:
    """Seconds to build the frame and turn it into terminal output, as Live does."""
    console, view = _console(height), ViewState(my_uid=1000, my_user="user0")
    start = time.perf_counter()
    console.print(render(snapshot, view, COLUMNS, height))
    return time.perf_counter() - start


def time_rich_table(snapshot: Snapshot) -> float:
    """The peer: rich's own Table of the same jobs, one row each, printed the same way."""
    console = _console(None)
    start = time.perf_counter()
    table = Table()
    for column in ("ID", "USER", "NAME", "STATE", "GPUS", "PRIO", "REASON"):
        table.add_column(column, no_wrap=True)
    for job in snapshot.jobs:
        table.add_row(
            str(job.id),
            job.user,
            job.name,
            job.state,
            str(job.gpus_requested),
            str(job.priority),
            job.pending_reason,
        )
    console.print(table)
    return time.perf_counter() - start


def time_rich_panels(rows: int) -> float:
    """The peer of a live frame: the same number of rows as rich Tables in Panels (how a
    first version of top drew them), 9 columns each, printed the same way."""
    console = _console(LINES)
    start = time.perf_counter()
    panels = []
    for rows_here in (8, rows - 19, 8, 3):
        table = Table(box=None, expand=True)
        for column in range(9):
            table.add_column(f"COL{column}", no_wrap=True, overflow="ellipsis")
        for row in range(rows_here):
            table.add_row(*(f"cell {row}.{column}" for column in range(9)))
        panels.append(Panel(table))
    console.print(Group(*panels))
    return time.perf_counter() - start


def bench_render(runs: int) -> None:
    snapshot = synthetic_snapshot()
    for _ in range(3):  # warm imports and caches, untimed
        time_frame(snapshot, LINES)
    shown_rows = (
        sum(
            line.startswith("│")
            for line in to_text(render(snapshot, ViewState(), COLUMNS, LINES), COLUMNS).splitlines()
        )
        - 4 * 2
    )
    live = [time_frame(snapshot, LINES) for _ in range(runs)]
    panels = [time_rich_panels(shown_rows) for _ in range(runs)]
    once = [time_frame(snapshot, None) for _ in range(runs)]
    peer = [time_rich_table(snapshot) for _ in range(runs)]
    live_ms, panels_ms = median_ms(live), median_ms(panels)
    once_ms, peer_ms = median_ms(once), median_ms(peer)
    print_table(
        f"one frame: 8 GPUs, 60 processes, 1,000 jobs; median of {runs} runs",
        ["frame", "median", "peer", "peer median", "ratio", f"target <= {FRAME_TARGET_MS:.0f} ms"],
        [
            [
                f"live {COLUMNS}x{LINES}",
                f"{live_ms:.1f} ms",
                f"rich Panel+Table, {shown_rows} rows",
                f"{panels_ms:.1f} ms",
                ratio(live_ms, panels_ms),
                verdict(live_ms, FRAME_TARGET_MS),
            ],
            [
                "--once (every row)",
                f"{once_ms:.1f} ms",
                "rich Table, 1,000 rows",
                f"{peer_ms:.1f} ms",
                ratio(once_ms, peer_ms),
                "",
            ],
        ],
    )


def _outside_processes(home: Path, count: int) -> list[subprocess.Popen]:
    """Real sleeping processes declared as outside users of the simulated GPUs."""
    sleepers = [subprocess.Popen(["sleep", "3600"]) for _ in range(count)]
    entries = [
        f'[[process]]\ngpu = {n % 8}\npid = {p.pid}\nuser = "someone"\n'
        f'memory = "2GiB"\nutil = 5\ncommand = "sleep 3600"\n'
        for n, p in enumerate(sleepers)
    ]
    (home / "state" / "simulated_processes.toml").write_text("\n".join(entries))
    return sleepers


def _start_top_in_pty(env: dict[str, str]) -> tuple[subprocess.Popen, int, threading.Thread]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", LINES, COLUMNS, 0, 0))
    env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    top = subprocess.Popen(
        [gpusched_script(), "top", "--interval", "1"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**env, "TERM": "xterm-256color"},
        start_new_session=True,
    )
    os.close(slave)

    def drain() -> None:  # a full pty would block top's writes
        while True:
            try:
                if not os.read(master, 65536):
                    return
            except OSError:
                return

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    return top, master, reader


def _cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def _cpu_pct_over(procs: list[psutil.Process], seconds: float) -> list[float]:
    """Each process's CPU over the next `seconds` of wall time, in % of one core."""
    before, wall0 = [_cpu_s(p) for p in procs], time.monotonic()
    time.sleep(seconds)
    after, wall = [_cpu_s(p) for p in procs], time.monotonic() - wall0
    return [100 * (b - a) / wall for a, b in zip(before, after)]


def bench_cpu(seconds: float, warmup_s: float) -> None:
    with Gpusched(simulate="8x80GiB") as gs:
        sleepers = _outside_processes(gs.home, 52)
        running = _submit_lines(gs, 8)
        _submit_lines(gs, 992)
        daemon = psutil.Process(gs.pid)
        time.sleep(warmup_s)  # let the daemon place and start the jobs first
        [idle_pct] = _cpu_pct_over([daemon], seconds)
        top, master, _ = _start_top_in_pty(gs.env)
        try:
            time.sleep(warmup_s)  # start-up (imports, first frame) is not the steady state
            top_pct, serving_pct = _cpu_pct_over([psutil.Process(top.pid), daemon], seconds)
            os.write(master, b"q")
            top.wait(timeout=10)
        finally:
            if top.poll() is None:
                top.send_signal(signal.SIGTERM)
                top.wait(timeout=10)
            os.close(master)
            gs.call("cancel", ids=running)  # the daemon's stop leaves jobs running
            for sleeper in sleepers:
                sleeper.kill()
                sleeper.wait()
    print_table(
        f"CPU of `gpusched top --interval 1` over {seconds:.0f} s, % of one core "
        "(8 GPUs, 60 processes, 1,000 jobs)",
        ["process", "CPU", "peer", "peer CPU", "ratio", f"target <= {CPU_TARGET_PCT:.0f}%"],
        [
            [
                "gpusched top",
                f"{top_pct:.2f}%",
                "the idle daemon",
                f"{idle_pct:.2f}%",
                ratio(top_pct, idle_pct),
                verdict(top_pct, CPU_TARGET_PCT),
            ],
            [
                "the daemon serving top",
                f"{serving_pct:.2f}%",
                "the idle daemon",
                f"{idle_pct:.2f}%",
                ratio(serving_pct, idle_pct),
                "",
            ],
        ],
    )
    print(f"  top exited with status {top.returncode} after `q`")


def _submit_lines(gs: Gpusched, count: int) -> list[int]:
    """Submit `count` one-GPU `sleep 3600` jobs in one request; their ids."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", dir="/tmp") as handle:
        handle.write("sleep 3600\n" * count)
        handle.flush()
        out = gs.cli("submit", "--json", "--gpus", "1", "--from-file", handle.name)
    data = json.loads(out)
    return data["ids"] if isinstance(data, dict) and "ids" in data else [j["id"] for j in data]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", choices=("render", "cpu", "all"), default="render")
    parser.add_argument("--runs", type=int, default=100, help="render samples (default 100)")
    parser.add_argument("--seconds", type=float, default=60.0, help="cpu window (default 60)")
    parser.add_argument("--warmup", type=float, default=5.0, help="untimed start (default 5 s)")
    args = parser.parse_args()
    if args.mode in ("render", "all"):
        bench_render(args.runs)
    if args.mode in ("cpu", "all"):
        bench_cpu(args.seconds, args.warmup)


if __name__ == "__main__":
    main()
