"""The daemon loop's longest turn while `gpusched gc` removes 100,000 finished jobs and
their log files, against the turn of one small submit in the same run (<= 100 ms).

The real loop (Daemon.step), request handlers and SQLite store, in this process, on a
temporary home with simulated GPUs. The jobs are a held array cancelled at once (so
finished), one in ten (--logs-every) given a small log file in its id-range directory,
as a run would leave: the rest have no files to remove, as jobs cancelled while pending.
Each turn is timed from outside, as a request waiting behind it would see it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench_big_batches import array_args, new_daemon, turns_of
from common import print_table, verdict

TARGET_MS = 100.0


def with_logs(daemon, ids: list[int]) -> int:
    """A small stdout log for these jobs, where their shims would have written it; bytes."""
    made = set()
    total = 0
    for job in daemon.state.store.many(ids).values():
        folder = os.path.dirname(job.stdout_path)
        if folder not in made:
            os.makedirs(folder, exist_ok=True)
            made.add(folder)
        with open(job.stdout_path, "wb") as log:
            total += log.write(b"epoch 1 loss 0.5\n")
    return total


def one_run(jobs: int, logs_every: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="gpusched-bench-") as tmp:
        root = Path(tmp)
        # Keep one finished job: the other ones go, whatever their age.
        (root / "gpusched.toml").write_text(
            '[jobs]\nkeep_finished = ""\nkeep_finished_count = 1\n[host]\ncpus = 64\n'
        )
        daemon = new_daemon(root)
        _, result = turns_of(daemon, "submit", array_args(root, jobs))
        turns_of(daemon, "cancel", {"ids": [result["array_ids"][0]]})
        with_logs(daemon, result["ids"][::logs_every])
        small, _ = turns_of(daemon, "submit", array_args(root, 1))
        started = time.perf_counter()
        gc, report = turns_of(daemon, "gc", {})
        gc_s = time.perf_counter() - started
        daemon.state.store.close()
        assert report["jobs"] == jobs - 1, report
        return {
            "small": max(small),
            "gc_turn": max(gc),
            "gc_s": gc_s,
            "turns": len(gc),
            "removed": report["jobs"],
            "files": len(result["ids"][::logs_every]),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--logs-every",
        type=int,
        default=10,
        metavar="N",
        help="a log file for every Nth job (1: all; making them is slow)",
    )
    opts = parser.parse_args()
    runs = [one_run(opts.jobs, opts.logs_every) for _ in range(opts.runs)]
    med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    longest_ms, small_ms = med["gc_turn"] * 1e3, med["small"] * 1e3
    print_table(
        f"Longest loop turn while gc removes {int(med['removed']):,} finished jobs "
        f"and {int(med['files']):,} logs (median of {opts.runs} run(s); target <= {TARGET_MS:.0f} ms)",
        [
            "1-job submit ms",
            "gc: longest turn ms",
            "gc s",
            "turns",
            "jobs/s",
            "longest / 1-job",
            "verdict",
        ],
        [
            [
                f"{small_ms:.1f}",
                f"{longest_ms:.1f}",
                f"{med['gc_s']:.1f}",
                int(med["turns"]),
                f"{med['removed'] / med['gc_s']:,.0f}",
                f"{longest_ms / small_ms:.0f}x",
                verdict(longest_ms, TARGET_MS),
            ]
        ],
    )


if __name__ == "__main__":
    main()
