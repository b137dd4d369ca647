"""A sweep of 100,000 trivial jobs against the same sweep of 100 (issue 23): the per-job
cost, the daemon's RSS with the queue pending, a restart on it, and `gpusched simulate` of a
100,000-job synthetic trace against a 1,000-job one.

The sweep is the issue's: `true` lines of one `submit --gpus 0 --from-file` (sent in files of
20,000 lines), `[jobs] max_running = 4`, 4 simulated GPUs, a 16-core host in the config. The
queue is filled while the daemon drains (nothing starts), so that the RSS and the restart
are measured with every job pending; then `resume`, and the per-job cost is the wall time
until the first --window jobs ended, divided by them (--sweep: the whole queue).
The trace is seeded: one-GPU jobs mostly, some of 2, 4 and 8 GPUs, arriving far faster
than 8 GPUs drain them, so the queue is long for most of the replay.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import time
from pathlib import Path

import psutil
from common import (
    Gpusched,
    base_env,
    gpusched_script,
    print_table,
    ratio,
    scratch_dir,
    timed_run,
    verdict,
)

CONFIG = "[host]\ncpus = 16\n[jobs]\nmax_running = 4\n"
LINES_PER_FILE = 20_000  # one submit's message stays well under the 16 MiB limit
TARGETS = {"per_job": 1.5, "rss_mb": 150.0, "restart_s": 5.0, "simulate_s": 30.0}


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def fill(gs: Gpusched, count: int) -> list[int]:
    """`count` lines of `true`, submitted in files of LINES_PER_FILE; the ids."""
    ids: list[int] = []
    for start in range(0, count, LINES_PER_FILE):
        lines = scratch_dir() / f"sweep-{start}.txt"
        lines.write_text("true\n" * min(LINES_PER_FILE, count - start))
        out = gs.cli("submit", "--json", "--gpus", "0", "--from-file", str(lines))
        ids += json.loads(out)["ids"]
    return ids


def restart(gs: Gpusched) -> float:
    """Seconds from `daemon start` until the daemon answers a request."""
    gs.cli("daemon", "stop")
    started = time.perf_counter()
    gs.cli("daemon", "start")
    status = json.loads(gs.cli("daemon", "status", "--json"))
    ready_s = time.perf_counter() - started
    gs.pid, gs.socket = status["pid"], status["socket"]
    return ready_s


def sweep(count: int, window: int) -> dict[str, float]:
    """One home: fill it draining, RSS, restart, then the per-job cost over `window` jobs."""
    with Gpusched("4x80GiB", config=CONFIG) as gs:
        gs.cli("drain")
        ids = fill(gs, count)
        pending_rss = rss_mb(gs.pid)
        ready_s = restart(gs)
        restarted_rss = rss_mb(gs.pid)
        window = min(window, count)
        started = time.perf_counter()
        gs.cli("resume")
        gs.wait([ids[window - 1]])
        per_job_ms = (time.perf_counter() - started) / window * 1e3
    return {
        "jobs": count,
        "window": window,
        "per_job_ms": per_job_ms,
        "rss_mb": pending_rss,
        "restart_s": ready_s,
        "restarted_rss_mb": restarted_rss,
    }


def write_trace(count: int, seed: int = 7) -> Path:
    """A history CSV of `count` jobs (see the module's docstring)."""
    rng = random.Random(seed)
    path = scratch_dir() / f"trace-{count}.csv"
    rows, submit_s = ["job_id,user,submit_s,num_gpus,duration_s"], 0.0
    for n in range(count):
        submit_s += rng.expovariate(1.0)
        gpus = rng.choices([1, 2, 4, 8], [70, 10, 12, 8])[0]
        rows.append(f"{n},u{rng.randrange(5)},{submit_s:.1f},{gpus},{rng.randint(60, 3600)}")
    path.write_text("\n".join(rows) + "\n")
    return path


def simulate_s(count: int) -> tuple[float, float]:
    """Wall and CPU seconds (user and system) of `gpusched simulate` of a `count`-job trace:
    on a loaded machine the CPU time is the figure that holds still."""
    trace = str(write_trace(count))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall_s, _ = timed_run(
        [gpusched_script(), "simulate", trace, "--gpus", "8", "--json"], base_env()
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall_s, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument(
        "--window",
        type=int,
        default=2_000,
        help="jobs timed of the big queue (the small one runs whole)",
    )
    parser.add_argument("--sweep", action="store_true", help="time the whole big queue")
    parser.add_argument("--sim-jobs", type=int, default=100_000)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="20,000 jobs, a window of 300, a 5,000-job trace: about a minute",
    )
    parser.add_argument(
        "--simulate-only",
        action="store_true",
        help="only the `gpusched simulate` figure (no daemon, no sweep)",
    )
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.window, args.sim_jobs = 20_000, 300, 5_000
    if not args.simulate_only:
        print_sweeps(args)
    print_simulate(args.sim_jobs)


def print_sweeps(args: argparse.Namespace) -> None:
    small = sweep(args.small, args.small)
    big = sweep(args.jobs, args.jobs if args.sweep else args.window)
    per_job = big["per_job_ms"] / small["per_job_ms"]
    print_table(
        f"A sweep of {args.jobs:,} `true` jobs against one of {args.small} (max_running = 4)",
        ["figure", f"{args.small} queued", f"{args.jobs:,} queued", "ratio", "target", ""],
        [
            [
                "per-job cost (ms)",
                f"{small['per_job_ms']:.2f}",
                f"{big['per_job_ms']:.2f}",
                ratio(big["per_job_ms"], small["per_job_ms"]),
                "<= 1.5x",
                verdict(per_job, TARGETS["per_job"]),
            ],
            [
                "daemon RSS, all pending (MB)",
                f"{small['rss_mb']:.0f}",
                f"{big['rss_mb']:.0f}",
                ratio(big["rss_mb"], small["rss_mb"]),
                "<= 150 MB",
                verdict(big["rss_mb"], TARGETS["rss_mb"]),
            ],
            [
                "restart until ready (s)",
                f"{small['restart_s']:.2f}",
                f"{big['restart_s']:.2f}",
                ratio(big["restart_s"], small["restart_s"]),
                "<= 5 s",
                verdict(big["restart_s"], TARGETS["restart_s"]),
            ],
            [
                "RSS after the restart (MB)",
                f"{small['restarted_rss_mb']:.0f}",
                f"{big['restarted_rss_mb']:.0f}",
                ratio(big["restarted_rss_mb"], small["restarted_rss_mb"]),
                "<= 150 MB",
                verdict(big["restarted_rss_mb"], TARGETS["rss_mb"]),
            ],
        ],
    )


def print_simulate(sim_jobs: int) -> None:
    """The replay of the big trace against the 1,000-job one, once the console script's
    byte code is cached (a first run compiles it): the median of three small runs."""
    simulate_s(1_000)
    smalls = [simulate_s(1_000) for _ in range(3)]
    small_sim, small_cpu = (statistics.median(run[n] for run in smalls) for n in (0, 1))
    big_sim, big_cpu = simulate_s(sim_jobs)
    print_table(
        f"`gpusched simulate` of a {sim_jobs:,}-job synthetic trace against 1,000",
        ["figure", "1,000 jobs", f"{sim_jobs:,} jobs", "ratio per job", "target", ""],
        [
            [
                "replay (s)",
                f"{small_sim:.2f}",
                f"{big_sim:.2f}",
                ratio(big_sim / sim_jobs, small_sim / 1_000),
                "<= 30 s",
                verdict(big_sim, TARGETS["simulate_s"]),
            ],
            [
                "its CPU time (s)",
                f"{small_cpu:.2f}",
                f"{big_cpu:.2f}",
                ratio(big_cpu / sim_jobs, small_cpu / 1_000),
                "<= 30 s",
                verdict(big_cpu, TARGETS["simulate_s"]),
            ],
        ],
    )


if __name__ == "__main__":
    main()
