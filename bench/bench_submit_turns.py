"""The daemon loop's turns while a streamed `submit --from-file` of 100,000 distinct lines is
stored, against the median turn and a one-job submit's turn in the same run (issue 23:
no turn over 100 ms), with what the longest turns spent their time on.

The real loop (Daemon.step), request handlers and SQLite store, in this process, on a
temporary home with simulated GPUs; the jobs are held, so nothing starts. Each turn is
timed from outside, as a request waiting behind it would see it, and split into the steps
that made the long turns of issue 23: a batch and its commits (Pace.batch), making the
committed jobs known to the scheduler (remember_alike), the reply (Submits._result) and the
garbage collector's collections (gc.callbacks). GPUSCHED_BENCH_SRC=DIR times the gpusched
of another checkout (an untouched main, say), as the other benchmarks do.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import REPO_ROOT, print_table, verdict  # noqa: F401 - REPO_ROOT puts the repo on the path

if os.environ.get("GPUSCHED_BENCH_SRC"):
    sys.path.insert(0, os.environ["GPUSCHED_BENCH_SRC"])

from bench_big_batches import ME, new_daemon

from gpusched.daemon import state
from gpusched.daemon.loop import Call
from gpusched.daemon.requests import batches, submits
from gpusched.daemon.requests.request import Request

TARGET_MS = 100.0
# What a long turn is split into: (name shown, owner, method).
STEPS = (
    ("batch", batches.Pace, "batch"),
    ("make known", state.DaemonState, "remember_alike"),
    ("reply", submits.Submits, "_result"),
)


class Split:
    """Seconds per step within the turn under way, and in the collector."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self._gc_started = 0.0
        for name, owner, method in STEPS:
            self._wrap(name, owner, method)
        gc.callbacks.append(self._collected)

    def _wrap(self, name: str, owner: type, method: str) -> None:
        real = owner.__dict__[method]
        func = real.__func__ if isinstance(real, staticmethod) else real

        @functools.wraps(func)
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                self.spent[name] = self.spent.get(name, 0.0) + time.perf_counter() - started

        setattr(owner, method, staticmethod(timed) if isinstance(real, staticmethod) else timed)

    def _collected(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            took = time.perf_counter() - self._gc_started
            self.spent["collector"] = self.spent.get("collector", 0.0) + took

    def take(self) -> dict[str, float]:
        spent, self.spent = self.spent, {}
        return spent


def sweep_args(root: Path, lines: int) -> dict:
    """A streamed submit as the socket server hands it to the loop, its lines read."""
    return {
        "jobs": [{"command": ["/bin/sh", "-c"], "hold": True, "gpus": 0}],
        "env": {"PATH": "/usr/bin:/bin", "HOME": str(root)},
        "cwd": str(root),
        "stream": "lines",
        "lines": [f"echo {i}" for i in range(lines)],
    }


def turns_of(daemon, split: Split, args: dict) -> list[tuple[float, dict[str, float]]]:
    """(seconds, seconds per step) of each turn until the submit is answered."""
    call = Call(Request("submit", args, ME))
    turns, calls = [], [call]
    split.take()
    while not call.done.is_set():
        started = time.perf_counter()
        daemon.step(calls)
        turns.append((time.perf_counter() - started, split.take()))
        calls = []
    assert call.error is None, call.error
    return turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--show", type=int, default=5, help="longest turns shown")
    parser.add_argument("--quick", action="store_true", help="20,000 lines")
    opts = parser.parse_args()
    if opts.quick:
        opts.lines = 20_000
    split = Split()
    with tempfile.TemporaryDirectory(prefix="gpusched-bench-") as tmp:
        root = Path(tmp)
        daemon = new_daemon(root)
        small = turns_of(daemon, split, sweep_args(root, 1))
        started = time.perf_counter()
        turns = turns_of(daemon, split, sweep_args(root, opts.lines))
        whole_s = time.perf_counter() - started
        daemon.state.store.close()
    gc.enable()
    gc.unfreeze()
    median_ms = statistics.median(t for t, _ in turns) * 1e3
    small_ms = max(t for t, _ in small) * 1e3
    longest = sorted(range(len(turns)), key=lambda i: -turns[i][0])[: opts.show]
    print_table(
        f"Loop turns while {opts.lines:,} streamed lines are stored ({len(turns)} turns, "
        f"{whole_s:.1f} s; target: longest <= {TARGET_MS:.0f} ms)",
        ["turn", "ms", "/ median", "/ 1-job submit", "spent on (ms)", "verdict"],
        [
            [
                f"{i + 1} of {len(turns)}",
                f"{turns[i][0] * 1e3:.1f}",
                f"{turns[i][0] * 1e3 / median_ms:.1f}x",
                f"{turns[i][0] * 1e3 / small_ms:.1f}x",
                ", ".join(f"{k} {v * 1e3:.1f}" for k, v in sorted(turns[i][1].items())) or "-",
                verdict(turns[i][0] * 1e3, TARGET_MS),
            ]
            for i in longest
        ]
        + [["median", f"{median_ms:.1f}", "1.0x", f"{median_ms / small_ms:.1f}x", "", ""]],
    )


if __name__ == "__main__":
    main()
