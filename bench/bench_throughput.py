"""1,000 trivial jobs, 4 at a time, until all are done: gpusched against task-spooler.

gpusched: one `gpusched submit --from-file FILE` (one round trip for all jobs), then the
daemon's `wait` until every job ended, two ways: `--gpus 0` jobs under `[jobs]
max_running = 4` (the comparison the issues ask for), and `--gpus 1` jobs on 4 simulated
GPUs (whole GPUs: the GPU path, which re-reads the GPUs after every end). At most 4 run
at once either way, which the benchmark checks from the jobs' start and end times.
task-spooler: `tsp -S 4`, one `tsp` call per job, then `tsp -l` polled until all finished.
Both run the same job, `sh -c true` (what a --from-file line `true` becomes). Each runs
--rounds times, in turn (the order flips every round); medians are compared.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import psutil
from common import (
    Gpusched,
    TaskSpooler,
    gpusched_script,
    print_table,
    ratio,
    scratch_dir,
    timed_run,
)


def most_at_once(jobs: list[dict]) -> int:
    """The largest number of jobs that ran at the same time, from their start/end times."""
    events = sorted([(j["started_at"], 1) for j in jobs] + [(j["ended_at"], -1) for j in jobs])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


# (label, submit flags, config, target ratio to tsp: issue 15's; the goal is 1.0): each
# keeps at most SLOTS jobs running. Every job reserves a core (--cpus 1), so the host is
# told it has enough for SLOTS whatever this box has.
MODES = {
    "max_running": (
        "--gpus 0, max_running = {slots}",
        ["--gpus", "0"],
        "[host]\ncpus = 64\n[jobs]\nmax_running = {slots}\n",
        1.3,
    ),
    "gpus": ("--gpus 1 on {slots} simulated GPUs", ["--gpus", "1"], "[host]\ncpus = 64\n", 1.5),
}


@dataclass
class GpuschedRun:
    elapsed_s: float
    most_at_once: int
    daemon_cpu_s: float  # the daemon's own CPU time
    launcher_cpu_s: float  # the job supervisor's own: it starts every job (or forks its shim)
    shims_cpu_s: float  # the supervisor's reaped children: the jobs (and any shims)


def _cpu_s(proc: psutil.Process, children: bool = False) -> float:
    times = proc.cpu_times()
    return times.children_user + times.children_system if children else times.user + times.system


def run_gpusched(count: int, slots: int, mode: str) -> GpuschedRun:
    _, flags, config, _ = MODES[mode]
    lines = scratch_dir() / "jobs.txt"
    lines.write_text("true\n" * count)
    with Gpusched(f"{slots}x80GiB", config=config.format(slots=slots)) as gs:
        daemon = psutil.Process(gs.pid)
        timed_run([gpusched_script(), "submit", "--wait", "--", "true"], gs.env)  # warm up
        launcher = daemon.children()[0]  # the job supervisor: starts every job, and reaps it
        before = (_cpu_s(daemon), _cpu_s(launcher), _cpu_s(launcher, children=True))
        start = time.perf_counter()
        _, out = timed_run([gpusched_script(), "submit", *flags, "--from-file", str(lines)], gs.env)
        jobs = gs.wait([int(i) for i in out.split()])
        elapsed = time.perf_counter() - start
        time.sleep(1.5)  # the last ends are reaped (a shim's within a second)
        after = (_cpu_s(daemon), _cpu_s(launcher), _cpu_s(launcher, children=True))
    failed = [j["id"] for j in jobs if j["state"] != "succeeded"]
    if failed:
        raise RuntimeError(f"gpusched jobs did not succeed: {failed[:10]}")
    return GpuschedRun(
        elapsed,
        most_at_once(jobs),
        daemon_cpu_s=after[0] - before[0],
        launcher_cpu_s=after[1] - before[1],
        shims_cpu_s=after[2] - before[2],
    )


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
    parser.add_argument("--rounds", type=int, default=5, help="runs of each (default 5)")
    args = parser.parse_args()

    contenders = ["tsp", *MODES]
    tsp_runs: list[float] = []
    runs: dict[str, list[GpuschedRun]] = {mode: [] for mode in MODES}
    for n in range(args.rounds):
        for name in contenders if n % 2 == 0 else contenders[::-1]:
            if name == "tsp":
                tsp_runs.append(run_tsp(args.jobs, args.slots))
            else:
                runs[name].append(run_gpusched(args.jobs, args.slots, name))
    tsp_s = statistics.median(tsp_runs)
    rows = []
    for mode, mode_runs in runs.items():
        label, _, _, target = MODES[mode]
        elapsed = statistics.median(r.elapsed_s for r in mode_runs)
        rows.append(
            [
                f"gpusched, {label.format(slots=args.slots)}",
                f"{elapsed:.2f} s",
                f"{args.jobs / elapsed:.0f}",
                str(max(r.most_at_once for r in mode_runs)),
                ratio(elapsed, tsp_s),
                f"<= {target}x " + ("ok" if elapsed <= target * tsp_s else "MISSED"),
            ]
        )
    rows.append(
        [
            f"tsp -S {args.slots}, one call per job",
            f"{tsp_s:.2f} s",
            f"{args.jobs / tsp_s:.0f}",
            "",
            "1.00x",
            "",
        ]
    )
    print_table(
        f"{args.jobs} jobs of `sh -c true`, {args.slots} at a time, submit until all "
        f"done (median of {args.rounds} rounds)",
        ["scheduler", "total", "jobs/s", "most at once", "ratio to tsp", "target (issue 15)"],
        rows,
    )
    print(
        "  each round, seconds: tsp "
        + " ".join(f"{s:.2f}" for s in tsp_runs)
        + "; "
        + "; ".join(
            f"gpusched ({mode}) " + " ".join(f"{r.elapsed_s:.2f}" for r in mode_runs)
            for mode, mode_runs in runs.items()
        )
    )
    for mode, mode_runs in runs.items():
        daemon, launcher, shims = (
            statistics.median(getattr(r, field) for r in mode_runs) / args.jobs * 1e3
            for field in ("daemon_cpu_s", "launcher_cpu_s", "shims_cpu_s")
        )
        print(
            f"  gpusched ({mode}) CPU per job (median): daemon {daemon:.1f} ms, "
            f"supervisor {launcher:.1f} ms, job (and shim) {shims:.1f} ms"
        )


if __name__ == "__main__":
    main()
