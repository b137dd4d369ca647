"""--gpu-mem auto on the shared Philly trace, and the cost of its history lookup.

1. The trace replayed with whole GPUs (the peer: what Philly's jobs asked for) and with
   each job's --gpu-mem estimated from the peaks of its key's earlier runs (p95 + margin;
   peaks from the seeded model in gpusched/sim/estimates.py), for several margins: average
   JCT and its ratio to the peer, jobs that shared a GPU, jobs that would have run out of
   GPU memory.
2. The estimate's store lookup (Store.gpu_peaks, what every `submit --gpu-mem auto` and
   `gpusched history` runs) on a store of 100,000 finished jobs against one of 600 jobs
   (the same 60 runs per key looked up), measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from common import REPO_ROOT, print_table, ratio

from gpusched.core.models import Job, JobState, Request
from gpusched.daemon.jobs.gpumemory import ESTIMATE_STATES
from gpusched.sim import estimates, simulator, traces
from gpusched.sim.simulator import check_choices
from gpusched.store.database import Store

TRACE = REPO_ROOT.parent / "shared" / "traces" / "philly_p8_2wk.csv"
GPUS, LOAD = 8, 0.5
MARGINS_PCT = (0.0, 10.0, 25.0)
KEYS = 500  # distinct job keys in the big store
PEER_JOBS, PEER_KEYS = 600, 10  # the small store: as many runs per key looked up (>= 50)


def replay(trace: traces.Trace, discipline: str, margin_pct: float | None) -> dict:
    """One replay's figures; margin None: whole GPUs, as the trace asked."""
    jobs, model = trace.jobs, None
    started = time.perf_counter()
    if margin_pct is not None:
        model = estimates.memory_model(jobs)
        jobs = estimates.with_estimates(
            jobs, model, check_choices(GPUS, "pack", discipline), margin_pct
        )
    results = simulator.simulate(jobs, gpus=GPUS, discipline=discipline)
    metrics = simulator.compute_metrics(results, GPUS)
    found = estimates.report(jobs, model, results) if model else None
    return {
        "jct_h": metrics.avg_jct_s / 3600,
        "util": metrics.gpu_utilization,
        "found": found,
        "s": time.perf_counter() - started,
    }


def replay_table(trace: traces.Trace, disciplines: tuple[str, ...]) -> None:
    rows = []
    for discipline in disciplines:
        peer = replay(trace, discipline, None)
        rows.append(
            (
                f"{discipline}, whole GPUs (peer)",
                f"{peer['jct_h']:.3f}",
                "1.00x",
                f"{peer['util'] * 100:.1f}",
                "-",
                "-",
                "-",
                f"{peer['s']:.2f}",
            )
        )
        for margin in MARGINS_PCT:
            ours = replay(trace, discipline, margin)
            found = ours["found"]
            rows.append(
                (
                    f"{discipline}, --gpu-mem auto +{margin:g}%",
                    f"{ours['jct_h']:.3f}",
                    ratio(ours["jct_h"], peer["jct_h"]),
                    f"{ours['util'] * 100:.1f}",
                    f"{found.estimated}/{found.jobs}",
                    str(found.shared_gpu),
                    str(found.would_oom),
                    f"{ours['s']:.2f}",
                )
            )
    print_table(
        f"{trace.source} on {GPUS} GPUs at load {LOAD}: whole GPUs vs --gpu-mem auto",
        [
            "replay",
            "avg JCT h",
            "vs peer",
            "GPU util %",
            "estimated",
            "shared a GPU",
            "would OOM",
            "replay s",
        ],
        rows,
    )


def _store(path: Path, jobs: int, keys: int) -> Store:
    """A store of `jobs` finished jobs over `keys` keys, each with a GPU peak."""
    store = Store(path)
    with store.write():
        store.insert(
            Job(
                id=0,
                command=("python", "train.py"),
                cwd="/",
                uid=1000,
                user="u",
                request=Request(gpus=1, gpu_mem_bytes=2**34),
                name=f"job{n % keys}",
                job_key=f"job{n % keys}",
                state=JobState.SUCCEEDED,
                submitted_at=n,
                started_at=n,
                ended_at=n + 1,
                gpu_mem_peak_bytes=2**33 + n,
            )
            for n in range(jobs)
        )
    return store


def lookup_table(jobs: int, runs: int) -> None:
    timings = {}
    peer = f"{PEER_JOBS} jobs (peer)"
    with tempfile.TemporaryDirectory(prefix="bench-est-") as tmp:
        for label, count, keys in ((peer, PEER_JOBS, PEER_KEYS), (f"{jobs:,} jobs", jobs, KEYS)):
            store = _store(Path(tmp) / f"{count}.db", count, keys)
            samples = []
            for n in range(runs):  # the same keys in both stores, each with >= 50 runs
                start = time.perf_counter()
                store.gpu_peaks(1000, f"job{n % PEER_KEYS}", ESTIMATE_STATES, 50)
                samples.append(time.perf_counter() - start)
            store.close()
            timings[label] = statistics.median(samples)
    print_table(
        f"Store.gpu_peaks (the --gpu-mem auto lookup, 50 runs): median of {runs}",
        ["store", "median ms", "vs peer"],
        [(label, f"{s * 1e3:.3f}", ratio(s, timings[peer])) for label, s in timings.items()],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs in the big store")
    parser.add_argument("--runs", type=int, default=200, help="lookups timed per store")
    parser.add_argument("--fifo-only", action="store_true", help="replay fifo only, not backfill")
    args = parser.parse_args()
    if not args.trace.exists():
        raise SystemExit(f"no trace at {args.trace}; pass --trace PATH")
    replay_table(
        traces.prepare(args.trace, gpus=GPUS, load=LOAD, arrivals="trace", seed=0),
        ("fifo",) if args.fifo_only else ("fifo", "backfill"),
    )
    lookup_table(args.jobs, args.runs)


if __name__ == "__main__":
    main()
