"""Submit-to-start latency on free GPUs, against task-spooler in the same run.

The job is `sh -c 'date +%s.%N > FILE'`: it records when its first instruction ran.
For both schedulers the end-to-end figure runs from just before the submit command is
spawned to that instant. For gpusched, the daemon's own view is shown too: its
`submitted_at` (when it queued the job) to `started_at` (when it launched the shim), and
`submitted_at` to the job's first instruction (queue to exec, shim start-up included).
Each job ends before the next is submitted, so the GPUs are free every time.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from common import (
    TSP,
    Gpusched,
    TaskSpooler,
    gpusched_script,
    interleaved,
    median_ms,
    print_table,
    ratio,
    scratch_dir,
    timed_run,
    verdict,
)

TARGET_MS = 50.0
HANDOVER_TARGET_MS = 50.0  # a freed GPU given to the next job (issue 40)


def stamp_command(path: Path) -> list[str]:
    return ["sh", "-c", f"date +%s.%N > {path}"]


def gpusched_sampler(gs: Gpusched, seen: dict[str, list[float]]) -> Callable[[], float]:
    """Submit one stamping job on a free GPU; return spawn -> job runs, note the rest in SEEN."""
    count = iter(range(10**9))

    def sample() -> float:
        path = scratch_dir() / f"gs-{next(count)}"
        before = time.time()
        _, out = timed_run(
            [gpusched_script(), "submit", "--gpus", "1", "--", *stamp_command(path)], gs.env
        )
        returned = time.time()
        job = gs.wait([int(out)])[0]
        ran_at = float(path.read_text())
        seen["returned_to_run"].append(ran_at - returned)
        seen["queued_to_launch"].append(job["started_at"] - job["submitted_at"])
        seen["queued_to_run"].append(ran_at - job["submitted_at"])
        return ran_at - before

    return sample


def tsp_sampler(ts: TaskSpooler, seen: dict[str, list[float]]) -> Callable[[], float]:
    count = iter(range(10**9))

    def sample() -> float:
        path = scratch_dir() / f"ts-{next(count)}"
        before = time.time()
        _, out = timed_run([TSP, *stamp_command(path)], ts.env)
        returned = time.time()
        ts.cli("-w", out.strip())
        ran_at = float(path.read_text())
        seen["returned_to_run"].append(ran_at - returned)
        return ran_at - before

    return sample


def handover_command(end: Path, start: Path) -> tuple[list[str], list[str]]:
    """The job holding the GPU stamps its last instruction; the next one its first."""
    return (["sh", "-c", f"sleep 0.2; date +%s.%N > {end}"], ["sh", "-c", f"date +%s.%N > {start}"])


def gpusched_handover(gs: Gpusched) -> Callable[[], float]:
    """On one GPU: a job ends, the next one (queued behind it) runs: the gap."""
    count = iter(range(10**9))

    def sample() -> float:
        n = next(count)
        end, start = scratch_dir() / f"gs-end-{n}", scratch_dir() / f"gs-start-{n}"
        first, second = handover_command(end, start)
        ids = [int(gs.cli("submit", "--gpus", "1", "--", *cmd)) for cmd in (first, second)]
        gs.wait(ids)
        return float(start.read_text()) - float(end.read_text())

    return sample


def tsp_handover(ts: TaskSpooler) -> Callable[[], float]:
    count = iter(range(10**9))

    def sample() -> float:
        n = next(count)
        end, start = scratch_dir() / f"ts-end-{n}", scratch_dir() / f"ts-start-{n}"
        first, second = handover_command(end, start)
        ts.submit(*first)
        ts.cli("-w", str(ts.submit(*second)))
        return float(start.read_text()) - float(end.read_text())

    return sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="jobs per scheduler (default 40)")
    args = parser.parse_args()

    gs_seen: dict[str, list[float]] = defaultdict(list)
    ts_seen: dict[str, list[float]] = defaultdict(list)
    with Gpusched("8x80GiB") as gs, TaskSpooler() as ts:
        contenders = {"gs": gpusched_sampler(gs, gs_seen), "ts": tsp_sampler(ts, ts_seen)}
        interleaved(3, contenders)  # warm caches, untimed
        gs_seen.clear()
        ts_seen.clear()
        e2e = interleaved(args.runs, contenders)
    with Gpusched("1x80GiB") as gs, TaskSpooler(slots=1) as ts:
        handover = {"gs": gpusched_handover(gs), "ts": tsp_handover(ts)}
        interleaved(2, handover)
        freed = interleaved(max(args.runs // 2, 5), handover)

    def row(label: str, ours: list[float], peer: list[float] | None, target: float = 0) -> list:
        ours_ms = median_ms(ours)
        peer_ms = median_ms(peer) if peer else None
        return [
            label,
            f"{ours_ms:.1f} ms",
            f"{peer_ms:.1f} ms" if peer_ms else "",
            ratio(ours_ms, peer_ms) if peer_ms else "",
            verdict(ours_ms, target) if target else "",
        ]

    print_table(
        f"submit-to-start latency, median ({args.runs} jobs each, interleaved, free GPUs)",
        ["from -> to", "gpusched", "tsp", "ratio", f"target <= {TARGET_MS:.0f} ms"],
        [
            row("submit command spawned -> job runs", e2e["gs"], e2e["ts"]),
            row(
                "submit command returned -> job runs",
                gs_seen["returned_to_run"],
                ts_seen["returned_to_run"],
            ),
            row("daemon queued job -> shim launched", gs_seen["queued_to_launch"], None),
            row("daemon queued job -> job runs", gs_seen["queued_to_run"], None, TARGET_MS),
            row(
                "a job's last instruction -> the next job on its GPU runs",
                freed["gs"],
                freed["ts"],
                HANDOVER_TARGET_MS,
            ),
        ],
    )


if __name__ == "__main__":
    main()
