"""Every placement policy x queue discipline on the Philly trace at loads 0.5 and 0.9.

Prints the Markdown table of docs/scheduling.md; `--write` replaces the table between its
markers in that file. A second, small table replays the same trace with memory-sharing
one-GPU jobs, where the placement policies do differ. `--disciplines` prints (or writes)
instead the table that weighs `las` against the others: fifo, backfill, sjf and las at
loads 0.5 and 0.7, on the Philly trace and on bench/traces/synthetic_p8_2wk.csv.
"""

from __future__ import annotations

import argparse
import random
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from common import REPO_ROOT

from gpusched.core.sched import placement, queuerules
from gpusched.sim import preemptsim, simulator, traces

TRACE = REPO_ROOT.parent / "shared" / "traces" / "philly_p8_2wk.csv"
DOC = REPO_ROOT / "docs" / "scheduling.md"
START, END = "<!-- scheduling-table:start -->", "<!-- scheduling-table:end -->"
GPUS = 8
LOADS = (0.5, 0.9)
POLICIES = tuple(placement.BUILTIN_POLICIES)
HEADER = (
    "load",
    "discipline",
    "policy",
    "avg JCT (h)",
    "median JCT (h)",
    "p99 JCT (h)",
    "avg wait (h)",
    "avg bounded slowdown",
    "GPU util",
    "Jain (tenants)",
)
SYNTHETIC = REPO_ROOT / "bench" / "traces" / "synthetic_p8_2wk.csv"  # bench/make_trace.py
VERSUS = ("<!-- las-table:start -->", "<!-- las-table:end -->")
VERSUS_LOADS = (0.5, 0.7)
VERSUS_DISCIPLINES = ("fifo", "backfill", "sjf", "las")
VERSUS_HEADER = (
    "trace",
    "load",
    "discipline",
    "avg JCT (h)",
    "p99 JCT (h)",
    "avg bounded slowdown",
    "preemptions per job",
    "GPU time lost",
)
SHARING_GIB = (8, 16, 24, 32, 40)  # what a one-GPU job asks for in the sharing variant


def sharing_variant(jobs: tuple[traces.TraceJob, ...]) -> tuple[traces.TraceJob, ...]:
    """One-GPU jobs declare 8-40 GiB (seeded), so up to several share an 80 GiB card."""
    rng = random.Random(5)
    return tuple(
        replace(j, gpu_mem_bytes=rng.choice(SHARING_GIB) * 2**30) if j.num_gpus == 1 else j
        for j in jobs
    )


def one_row(args: tuple[float, str, str, bool, Path]) -> tuple[str, ...]:
    load, discipline, policy, sharing, path = args
    trace = traces.prepare(path, gpus=GPUS, load=load, arrivals="trace", seed=0)
    jobs = sharing_variant(trace.jobs) if sharing else trace.jobs
    m = simulator.compute_metrics(
        simulator.simulate(jobs, gpus=GPUS, policy=policy, discipline=discipline), GPUS
    )
    hours = [f"{v / 3600:.3f}" for v in (m.avg_jct_s, m.median_jct_s, m.p99_jct_s, m.avg_wait_s)]
    return (
        f"{load:g}",
        discipline,
        policy,
        *hours,
        f"{m.avg_bounded_slowdown:.1f}",
        f"{m.gpu_utilization * 100:.1f} %",
        f"{m.jain_fairness:.3f}",
    )


def versus_row(args: tuple[Path, float, str]) -> tuple[str, ...]:
    """One discipline as `gpusched simulate TRACE --load L --discipline D` replays it:
    las with its preemptions (every job preemptible), the others without."""
    path, load, discipline = args
    jobs = traces.prepare(path, gpus=GPUS, load=load, arrivals="trace", seed=0).jobs
    extra = ["", ""]
    if discipline == "las":
        results, replay = preemptsim.replay_with_priorities(
            jobs,
            gpus=GPUS,
            urgent=frozenset(),
            model=preemptsim.PreemptionModel(),
            policy="pack",
            queue=queuerules.QueueRules(discipline="las"),
        )
        work = sum(r.num_gpus * r.duration_s for r in results)
        lost = replay.lost_gpu_s / (work + replay.lost_gpu_s)
        extra = [f"{replay.preemptions / len(results):.2f}", f"{lost * 100:.2f} %"]
    else:
        results = simulator.simulate(jobs, gpus=GPUS, policy="pack", discipline=discipline)
    m = simulator.compute_metrics(results, GPUS)
    return (
        path.name,
        f"{load:g}",
        discipline,
        f"{m.avg_jct_s / 3600:.2f}",
        f"{m.p99_jct_s / 3600:.1f}",
        f"{m.avg_bounded_slowdown:.1f}",
        *extra,
    )


def versus(philly: Path, workers: int) -> str:
    runs = [
        (path, load, d)
        for path in (philly, SYNTHETIC)
        for load in VERSUS_LOADS
        for d in VERSUS_DISCIPLINES
    ]
    with ProcessPoolExecutor(workers) as pool:
        rows = list(pool.map(versus_row, runs))
    return "\n".join([VERSUS[0], markdown(rows, VERSUS_HEADER), VERSUS[1]])


def markdown(rows: list[tuple[str, ...]], header: tuple[str, ...] = HEADER) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def policies_agree(rows: list[tuple[str, ...]]) -> bool:
    """Whether, for each load and discipline, every policy gave the very same figures."""
    by_setting: dict[tuple[str, str], set[tuple[str, ...]]] = {}
    for row in rows:
        by_setting.setdefault(row[:2], set()).add(row[3:])
    return all(len(figures) == 1 for figures in by_setting.values())


def build(path: Path, workers: int) -> str:
    whole = [
        (load, d, p, False, path)
        for load in LOADS
        for d in queuerules.DISCIPLINES
        for p in POLICIES
    ]
    shared = [(0.9, d, p, True, path) for d in ("fifo", "backfill") for p in POLICIES]
    with ProcessPoolExecutor(workers) as pool:
        whole_rows = list(pool.map(one_row, whole))
        shared_rows = list(pool.map(one_row, shared))
    same = (
        "every policy gives the same figures"
        if policies_agree(whole_rows)
        else "POLICIES DIFFER (see the rows)"
    )
    return "\n".join(
        [
            START,
            f"Whole-GPU jobs, as in the trace ({len(whole_rows)} runs; {same}):",
            "",
            markdown(whole_rows),
            "",
            "The same trace at load 0.9 with every one-GPU job declaring 8-40 GiB "
            "(`sharing_variant` in the script), so jobs share cards:",
            "",
            markdown(shared_rows),
            "",
            f"Generated by `bench/scheduling_table.py` from `{path.name}` on {GPUS} GPUs "
            "(original spacing, exact durations as time limits, fair-share half-life 1 day).",
            END,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--write", action="store_true", help=f"update the table in {DOC}")
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    parser.add_argument(
        "--disciplines", action="store_true", help="the las table: both traces, loads 0.5, 0.7"
    )
    args = parser.parse_args()
    started = time.perf_counter()
    start, end = VERSUS if args.disciplines else (START, END)
    table = (
        versus(args.trace, args.workers) if args.disciplines else build(args.trace, args.workers)
    )
    if args.write:
        text = DOC.read_text()
        if start not in text or end not in text:
            raise SystemExit(f"{DOC} lacks the markers {start} and {end}")
        DOC.write_text(text[: text.index(start)] + table + text[text.index(end) + len(end) :])
        print(f"updated {DOC} in {time.perf_counter() - started:.0f} s")
    else:
        print(table)


if __name__ == "__main__":
    main()
