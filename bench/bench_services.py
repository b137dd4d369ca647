"""`gpusched service`: requests per second and p99 through the HAProxy front door against a
direct connection to the same replica (same run, alternating), then the throughput of 1, 2
and 4 replicas of jobs/serve.py through the door, on simulated GPUs. Needs torch (the
`jobs` extra) and HAProxy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time

from common import REPO_ROOT, Gpusched, interleaved, print_table, ratio

sys.path.insert(0, str(REPO_ROOT / "jobs"))
from loadgen import LoadResult, run_load

MODEL_ARGS = ("--hidden", "512", "--layers", "4", "--threads", "1")


def ready(gs: Gpusched, count: int, timeout_s: float = 180.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        shown = json.loads(gs.cli("service", "show", "bench", "--json"))
        if sum(r["door"] == "ready" for r in shown["replicas"]) == count == len(shown["replicas"]):
            return shown
        time.sleep(0.2)
    raise RuntimeError(f"{count} replica(s) were not ready within {timeout_s:.0f} s")


def load(url: str, args: argparse.Namespace) -> LoadResult:
    result = run_load(url, args.clients, args.duration_s)
    if result.requests == 0 or result.errors:
        raise RuntimeError(f"{url}: {result.requests} answered, {result.errors} failed")
    return result


def median(results: list[LoadResult], pct: float | None = None) -> float:
    if pct is None:
        return statistics.median(r.throughput_rps for r in results)
    return statistics.median(r.percentile_ms(pct) for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--duration-s", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if not (shutil.which("haproxy") or os.path.exists("/usr/sbin/haproxy")):
        print("bench_services: skipped, HAProxy is not installed (apt-get install haproxy)")
        return
    with Gpusched("4x80GiB") as gs:
        try:
            run(gs, args)
        finally:
            gs.cli("service", "delete", "bench")


def run(gs: Gpusched, args: argparse.Namespace) -> None:
    created = json.loads(
        gs.cli(
            "service",
            "create",
            "bench",
            "--json",
            "--replicas",
            "1",
            "--gpus",
            "1",
            "--health",
            "/healthz",
            "--",
            sys.executable,
            str(REPO_ROOT / "jobs" / "serve.py"),
            *MODEL_ARGS,
        )
    )
    door = f"http://{created['listen']}"
    direct = f"http://127.0.0.1:{ready(gs, 1)['replicas'][0]['port']}"
    for url in (door, direct):
        run_load(url, 4, 0.5)  # warm-up: the first calls of each shape are slow
    results: dict[str, list[LoadResult]] = {"direct": [], "door": []}

    def one(name: str, url: str):
        def measure() -> float:
            results[name].append(load(url, args))
            return results[name][-1].throughput_rps

        return measure

    interleaved(args.rounds, {"direct": one("direct", direct), "door": one("door", door)})
    print_table(
        f"One replica, {args.clients} clients, {args.duration_s:g} s x {args.rounds}",
        ("path", "req/s", "p50 ms", "p99 ms", "req/s vs direct"),
        [
            (
                name,
                f"{median(r):.0f}",
                f"{median(r, 50):.1f}",
                f"{median(r, 99):.1f}",
                ratio(median(r), median(results["direct"])),
            )
            for name, r in results.items()
        ],
    )
    rows, base = [], 0.0
    for replicas in (1, 2, 4):
        if replicas > 1:
            gs.cli("service", "scale", "bench", str(replicas))
            ready(gs, replicas)
            run_load(door, 4, 0.5)
        got = [load(door, args) for _ in range(args.rounds)]
        base = base or median(got)
        rows.append(
            (replicas, f"{median(got):.0f}", f"{median(got, 99):.1f}", ratio(median(got), base))
        )
    print_table(
        f"Through the front door, {args.clients} clients (replicas share "
        f"{os.cpu_count()} cores: CPU-bound replicas cannot scale past them)",
        ("replicas", "req/s", "p99 ms", "vs 1 replica"),
        rows,
    )


if __name__ == "__main__":
    main()
