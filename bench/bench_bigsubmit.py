"""`submit --from-file` of 100,000 lines against one of 1,000 (time per line), the loop's
longest stall meanwhile, and `submit` with 100,000 pending against none (issue 23).

Real CLI, real daemons on simulated GPUs. The stall is what a client polling the loop
(`show` of one job, answered by the loop thread) sees while the big submit is stored:
median and longest answer. The latency of `submit --hold -- true` is compared between a
daemon with the 100,000 jobs pending (held) and an empty one, interleaved round by round.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import threading
import time

from common import (
    Gpusched,
    gpusched_script,
    interleaved,
    print_table,
    ratio,
    scratch_dir,
    timed_run,
    verdict,
)

WHOLE_S = 10.0  # 100,000 lines, end to end
STALL_MS = 100.0  # the loop's longest turn while they are stored
LATENCY_RATIO = 1.2  # submit with 100,000 pending / with none
CONFIG = "[host]\ncpus = 16\n"


def sweep_file(lines: int) -> str:
    path = scratch_dir() / f"sweep-{lines}.txt"
    if not path.exists():
        path.write_text("".join(f"echo {i}\n" for i in range(lines)))
    return str(path)


def submit_sweep(daemon: Gpusched, lines: int) -> float:
    """Seconds for `submit --hold --gpus 0 --from-file` of `lines` lines; NaN (said on
    stderr) when it is refused, as gpusched before streamed submits refuses 100,000."""
    try:
        elapsed, out = timed_run(
            [
                gpusched_script(),
                "submit",
                "--hold",
                "--gpus",
                "0",
                "--from-file",
                sweep_file(lines),
            ],
            daemon.env,
        )
    except RuntimeError as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return math.nan
    assert len(out.split()) == lines, "every line queued"
    return elapsed


def polled_while(daemon: Gpusched, work) -> tuple[float, list[float]]:
    """work()'s result, and the answer times (s) of `show` polled back to back meanwhile."""
    answers: list[float] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            started = time.perf_counter()
            daemon.call("show", ids=[1])
            answers.append(time.perf_counter() - started)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        result = work()
    finally:
        done.set()
        poller.join()
    return result, answers


def one_submit(daemon: Gpusched) -> float:
    return timed_run([gpusched_script(), "submit", "--hold", "--", "true"], daemon.env)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--small", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=20, help="submits timed per daemon")
    parser.add_argument("--quick", action="store_true", help="20,000 lines, one run, 8 rounds")
    opts = parser.parse_args()
    if opts.quick:
        opts.lines, opts.runs, opts.rounds = 20_000, 1, 8
    big_s, small_s, answers = [], [], []
    with Gpusched("4x80GiB", CONFIG) as empty:
        empty.cli("submit", "--hold", "--", "true")  # job 1, which the poller shows
        for _ in range(opts.runs):
            with Gpusched("4x80GiB", CONFIG) as daemon:
                daemon.cli("submit", "--hold", "--", "true")
                small_s.append(submit_sweep(daemon, opts.small))
                elapsed, polled = polled_while(daemon, lambda: submit_sweep(daemon, opts.lines))
                big_s.append(elapsed)
                answers += polled
        # The last daemon's queue is gone with it: fill one more for the latency rounds.
        with Gpusched("4x80GiB", CONFIG) as full:
            full.cli("submit", "--hold", "--", "true")
            if math.isnan(submit_sweep(full, opts.lines)):  # refused: in as many as it takes
                for start in range(0, opts.lines, 20_000):
                    submit_sweep(full, min(20_000, opts.lines - start))
            latency = interleaved(
                opts.rounds, {"empty": lambda: one_submit(empty), "full": lambda: one_submit(full)}
            )
    big, small = statistics.median(big_s), statistics.median(small_s)
    per_line_ratio = (big / opts.lines) / (small / opts.small)
    answers = answers or [math.nan]
    stall_ms = max(answers) * 1e3
    lat_empty, lat_full = (statistics.median(latency[k]) * 1e3 for k in ("empty", "full"))
    print_table(
        f"submit --from-file: {opts.lines:,} lines against {opts.small:,} "
        f"(median of {opts.runs}; target <= {WHOLE_S:.0f} s for 100,000)",
        ["lines", "wall s", "us per line", "per line / small", "verdict"],
        [
            [f"{opts.small:,}", f"{small:.2f}", f"{small / opts.small * 1e6:.0f}", "1.00x", "-"],
            [
                f"{opts.lines:,}",
                f"{big:.2f}",
                f"{big / opts.lines * 1e6:.0f}",
                f"{per_line_ratio:.2f}x",
                verdict(big * 100_000 / opts.lines, WHOLE_S),
            ],
        ],
    )
    print_table(
        f"The loop while they are stored: `show` polled back to back "
        f"({len(answers)} answers; target: longest <= {STALL_MS:.0f} ms)",
        ["median ms", "longest ms", "longest / median", "verdict"],
        [
            [
                f"{statistics.median(answers) * 1e3:.1f}",
                f"{stall_ms:.1f}",
                ratio(stall_ms, statistics.median(answers) * 1e3),
                verdict(stall_ms, STALL_MS),
            ]
        ],
    )
    print_table(
        f"submit --hold -- true: {opts.lines:,} pending against none (median of "
        f"{opts.rounds}, interleaved; target <= {LATENCY_RATIO}x)",
        ["queue", "ms", "ratio", "verdict"],
        [
            ["empty", f"{lat_empty:.1f}", "1.00x", "-"],
            [
                f"{opts.lines:,} pending",
                f"{lat_full:.1f}",
                ratio(lat_full, lat_empty),
                verdict(lat_full / lat_empty, LATENCY_RATIO),
            ],
        ],
    )


if __name__ == "__main__":
    main()
