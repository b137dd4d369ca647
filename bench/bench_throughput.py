"""1,000 trivial jobs, 4 at a time, until all are done: gpusched against task-spooler.

gpusched: one `gpusched submit --gpus 1 --from-file FILE` (one round trip for all jobs),
then the daemon's `wait` until every job ended. gpusched has no "at most N running"
setting yet, so the jobs ask for a whole GPU each on 4 simulated GPUs: at most 4 run at
once, which the benchmark checks from the jobs' start and end times.
task-spooler: `tsp -S 4`, one `tsp` call per job, then `tsp -l` polled until all finished.
Both run the same job, `sh -c true` (what a --from-file line `true` becomes).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import psutil

from common import (Gpusched, TaskSpooler, base_env, gpusched_script, print_table, ratio,
                    scratch_dir, timed_run)

FLOOR_RATIO = 2.0  # this floor; the goal is 1.0 (no slower than task-spooler)


def most_at_once(jobs: list[dict]) -> int:
    """The largest number of jobs that ran at the same time, from their start/end times."""
    events = sorted([(j["started_at"], 1) for j in jobs] + [(j["ended_at"], -1) for j in jobs])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def host_config(slots: int) -> str:
    """gpusched versions that reserve a core per job (`--cpus`, default 1) would hold a
    small machine to fewer than SLOTS jobs: tell the daemon the host has SLOTS cores."""
    help_text = timed_run([gpusched_script(), "submit", "--help"], base_env())[1]
    return f"[host]\ncpus = {slots}\n" if "--cpus" in help_text else ""


@dataclass
class GpuschedRun:
    elapsed_s: float
    most_at_once: int
    daemon_cpu_s: float  # the daemon's own CPU time
    shims_cpu_s: float  # its reaped children's: the shims and the jobs under them


def run_gpusched(count: int, slots: int) -> GpuschedRun:
    lines = scratch_dir() / "jobs.txt"
    lines.write_text("true\n" * count)
    with Gpusched(f"{slots}x80GiB", config=host_config(slots)) as gs:
        daemon = psutil.Process(gs.pid)
        before = daemon.cpu_times()
        start = time.perf_counter()
        _, out = timed_run([gpusched_script(), "submit", "--gpus", "1", "--from-file",
                            str(lines)], gs.env)
        jobs = gs.wait([int(i) for i in out.split()])
        elapsed = time.perf_counter() - start
        time.sleep(1.0)  # the daemon reaps the last shims on its next pass
        after = daemon.cpu_times()
    failed = [j["id"] for j in jobs if j["state"] != "succeeded"]
    if failed:
        raise RuntimeError(f"gpusched jobs did not succeed: {failed[:10]}")
    return GpuschedRun(
        elapsed, most_at_once(jobs),
        daemon_cpu_s=after.user + after.system - before.user - before.system,
        shims_cpu_s=(after.children_user + after.children_system
                     - before.children_user - before.children_system))


def run_tsp(count: int, slots: int) -> float:
    with TaskSpooler(slots) as ts:
        start = time.perf_counter()
        for _ in range(count):
            ts.submit("sh", "-c", "true")
        ts.wait_all()
        elapsed = time.perf_counter() - start
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs per scheduler (default 1000)")
    parser.add_argument("--slots", type=int, default=4, help="jobs at once (default 4)")
    args = parser.parse_args()

    tsp_s = run_tsp(args.jobs, args.slots)
    gs = run_gpusched(args.jobs, args.slots)
    gs_s = gs.elapsed_s
    print_table(
        f"{args.jobs} jobs of `sh -c true`, {args.slots} at a time, submit until all done "
        f"(gpusched: --gpus 1 on {args.slots} simulated GPUs; at most {gs.most_at_once} "
        "ran at once)",
        ["scheduler", "total", "jobs/s", "ratio to tsp", f"floor <= {FLOOR_RATIO:.0f}x"],
        [["gpusched --from-file", f"{gs_s:.2f} s", f"{args.jobs / gs_s:.0f}",
          ratio(gs_s, tsp_s), "ok" if gs_s <= FLOOR_RATIO * tsp_s else "MISSED"],
         [f"tsp -S {args.slots}, one call per job", f"{tsp_s:.2f} s",
          f"{args.jobs / tsp_s:.0f}", "1.00x", ""]])
    print(f"  gpusched CPU per job: daemon {gs.daemon_cpu_s / args.jobs * 1e3:.1f} ms, "
          f"shim and job {gs.shims_cpu_s / args.jobs * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
