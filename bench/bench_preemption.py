"""Preemption on the Philly trace: what urgent jobs gain, and what the rest pay.

A seeded share of the 1,822 jobs (10 % by default) is made urgent (priority 10; the
trace has no priorities); the others are preemptible. The peer is the same replay, same
urgent jobs, without preemption (urgent jobs still go first in the queue). With it, an
urgent job that cannot start stops the victims core/preemption.choose_victims picks, as
the daemon does: each runs on for a 60 s grace, checkpoints, and later resumes with its
remaining work plus 60 s to restart (sim/preemptsim.py). Figures are medians over the seeds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from common import REPO_ROOT, print_table, ratio

from gpusched.sim import preemptsim, simulator, traces

TRACE = REPO_ROOT.parent / "shared" / "traces" / "philly_p8_2wk.csv"
GPUS = 8


def replay(trace: traces.Trace, urgent: frozenset[int], preemption: bool) -> dict[str, float]:
    start = time.perf_counter()
    model = preemptsim.PreemptionModel() if preemption else None
    results, count = preemptsim.simulate_with_priorities(
        trace.jobs, gpus=GPUS, urgent=urgent, model=model
    )
    wall_s = time.perf_counter() - start
    every = simulator.compute_metrics(results, GPUS)
    high = simulator.compute_metrics([r for n, r in enumerate(results) if n in urgent], GPUS)
    return {
        "high_jct_h": high.avg_jct_s / 3600,
        "high_bsld": high.avg_bounded_slowdown,
        "all_jct_h": every.avg_jct_s / 3600,
        "all_bsld": every.avg_bounded_slowdown,
        "preemptions": float(count),
        "wall_s": wall_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--load", type=float, default=0.5)
    parser.add_argument(
        "--share",
        type=float,
        default=preemptsim.DEFAULT_HIGH_SHARE,
        help="share of urgent jobs (default 0.1)",
    )
    parser.add_argument("--seeds", type=int, default=3, help="urgent-job draws (default 3)")
    args = parser.parse_args()
    if not args.trace.exists():
        raise SystemExit(f"no trace at {args.trace}; pass --trace PATH")
    trace = traces.prepare(args.trace, gpus=GPUS, load=args.load, arrivals="trace", seed=0)
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for seed in range(args.seeds):
        urgent = preemptsim.urgent_ids(len(trace.jobs), args.share, seed)
        for preemption in (False, True):  # alternate, so that load drift hits both
            runs[preemption].append(replay(trace, urgent, preemption))
    med = {p: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for p, rs in runs.items()}
    peer = med[False]
    rows = []
    for name, figures in (("no preemption (peer)", peer), ("preemption", med[True])):
        rows.append(
            (
                name,
                f"{figures['high_jct_h']:.3f}",
                ratio(figures["high_jct_h"], peer["high_jct_h"]),
                f"{figures['high_bsld']:.2f}",
                f"{figures['all_jct_h']:.3f}",
                ratio(figures["all_jct_h"], peer["all_jct_h"]),
                f"{figures['all_bsld']:.2f}",
                f"{figures['preemptions']:.0f}",
                f"{figures['wall_s']:.2f}",
                ratio(figures["wall_s"], peer["wall_s"]),
            )
        )
    print_table(
        f"Preemption, {args.trace.name} on {GPUS} GPUs at load {args.load}, "
        f"{args.share:.0%} urgent jobs: medians over {args.seeds} seeds",
        [
            "replay",
            "urgent JCT h",
            "vs peer",
            "urgent bsld",
            "all JCT h",
            "vs peer",
            "all bsld",
            "preemptions",
            "replay s",
            "vs peer",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
