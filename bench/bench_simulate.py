"""Replaying the 1,822-job Philly trace: `gpusched simulate` against peers in the same run.

Peers: parsing the trace alone (the floor every replay pays), and a minimal skip-ahead FIFO
event loop in plain Python that counts free GPUs (no gpusched code: what the replay would
cost without the daemon's own placement and ordering). The minimal loop's average JCT
must equal gpusched's FIFO figure, so it doubles as an independent check.
Target (issue 5): a replay takes <= 5 s on this machine.
"""

from __future__ import annotations

import argparse
import heapq
import resource
import statistics
import time
from pathlib import Path

from common import (
    REPO_ROOT,
    base_env,
    gpusched_script,
    interleaved,
    print_table,
    ratio,
    timed_run,
    verdict,
)

from gpusched.sim import simulator, traces

TRACE = REPO_ROOT.parent / "shared" / "traces" / "philly_p8_2wk.csv"
TARGET_S = 5.0
GPUS, LOAD = 8, 0.5
DISCIPLINES = ("fifo", "backfill", "sjf", "fairshare")


def replay(path: Path, discipline: str) -> float:
    """Average JCT in seconds; the whole pipeline the command runs, minus printing."""
    trace = traces.prepare(path, gpus=GPUS, load=LOAD, arrivals="trace", seed=0)
    results = simulator.simulate(trace.jobs, gpus=GPUS, discipline=discipline)
    return simulator.compute_metrics(results, GPUS).avg_jct_s


def parse_only(path: Path) -> float:
    return float(len(traces.prepare(path, gpus=GPUS, load=LOAD, arrivals="trace", seed=0).jobs))


def minimal_fifo(path: Path) -> float:
    """Skip-ahead FIFO by GPU count: the same events, none of gpusched's scheduling code."""
    jobs = traces.prepare(path, gpus=GPUS, load=LOAD, arrivals="trace", seed=0).jobs
    free, arrival, pending, ends, jct_sum_s = GPUS, 0, [], [], 0.0
    while arrival < len(jobs) or ends:
        now = min(
            jobs[arrival].submit_s if arrival < len(jobs) else float("inf"),
            ends[0][0] if ends else float("inf"),
        )
        while ends and ends[0][0] <= now:
            free += heapq.heappop(ends)[1]
        while arrival < len(jobs) and jobs[arrival].submit_s <= now:
            pending.append(jobs[arrival])
            arrival += 1
        waiting = []
        for job in pending:
            if job.num_gpus <= free:
                free -= job.num_gpus
                heapq.heappush(ends, (now + job.duration_s, job.num_gpus))
                jct_sum_s += now + job.duration_s - job.submit_s
            else:
                waiting.append(job)
        pending = waiting
    return jct_sum_s / len(jobs)


def cpu_s() -> float:
    """CPU seconds of this process and its finished children: on a busy shared machine
    wall time mostly measures the wait for a core, CPU time what the replay costs."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def seconds_of(fn, cpu: list[float], *args):
    """A contender for `interleaved`: returns wall seconds, appends CPU seconds to `cpu`."""

    def run() -> float:
        start, start_cpu = time.perf_counter(), cpu_s()
        fn(*args)
        cpu.append(cpu_s() - start_cpu)
        return time.perf_counter() - start

    return run


def run_cli(path: Path) -> None:
    timed_run([gpusched_script(), "simulate", str(path), "--load", str(LOAD)], base_env())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="samples per row (default 5)")
    parser.add_argument("--trace", type=Path, default=TRACE)
    args = parser.parse_args()
    if not args.trace.exists():
        raise SystemExit(f"no trace at {args.trace}; pass --trace PATH")
    peer = "minimal count-only FIFO loop (peer)"
    work = {
        "parse the trace only (peer)": (parse_only,),
        peer: (minimal_fifo,),
        **{f"replay, {d}": (replay, d) for d in DISCIPLINES},
        "`gpusched simulate` end to end (fifo)": (run_cli,),
    }
    cpu: dict[str, list[float]] = {name: [] for name in work}
    contenders = {
        name: seconds_of(fn, cpu[name], args.trace, *extra) for name, (fn, *extra) in work.items()
    }
    samples = interleaved(args.runs, contenders)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    cpu_medians = {name: statistics.median(values) for name, values in cpu.items()}
    print_table(
        f"Replay of {args.trace.name} on {GPUS} GPUs at load {LOAD}: median of {args.runs} runs",
        ["what", "wall s", "CPU s", "wall vs minimal loop"],
        [
            (name, f"{s:.3f}", f"{cpu_medians[name]:.3f}", ratio(s, medians[peer]))
            for name, s in medians.items()
        ],
    )
    ours_h, loop_h = replay(args.trace, "fifo") / 3600, minimal_fifo(args.trace) / 3600
    agree = "agree" if f"{ours_h:.3f}" == f"{loop_h:.3f}" else "DISAGREE"
    print(
        f"\n  average JCT, fifo: gpusched {ours_h:.3f} h, minimal loop {loop_h:.3f} h "
        f"({agree}; the trace README says 13.364 h)"
    )
    slowest = max(medians[n] for n in contenders if "peer" not in n)
    print(
        f"  slowest replay {slowest:.2f} s; target <= {TARGET_S:.0f} s: "
        f"{verdict(slowest, TARGET_S)}"
    )


if __name__ == "__main__":
    main()
