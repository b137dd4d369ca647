#!/bin/sh
# Run every benchmark in turn: under 5 minutes in all (about 4 on 2 cores). --quick
# shrinks each to a smoke run (about a minute and a half in all).
# PYTHON=path/to/venv/bin/python picks the interpreter (default: python3 on PATH, e.g. an
# activated venv); gpusched is the console script beside it.
# GPUSCHED_BENCH_SRC=DIR benchmarks gpusched from another checkout instead.
set -eu
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
if [ "${1:-}" = "--quick" ]; then
    "$PYTHON" bench_submit.py --runs 10 --ls-runs 5
    "$PYTHON" bench_commands.py --runs 5
    "$PYTHON" bench_latency.py --runs 10
    "$PYTHON" bench_throughput.py --jobs 100 --rounds 1
    "$PYTHON" bench_idle.py --seconds 10
    "$PYTHON" bench_scrape.py --runs 30
    "$PYTHON" bench_top.py all --runs 20 --seconds 10 --warmup 3
    "$PYTHON" bench_big_store.py --jobs 20000 --runs 5 --idle-seconds 5
    "$PYTHON" bench_retention.py --jobs 20000
    "$PYTHON" bench_estimates.py --fifo-only --jobs 5000 --runs 20
    "$PYTHON" bench_preemption.py --seeds 1
    "$PYTHON" bench_services.py --duration-s 1 --rounds 1
else
    "$PYTHON" bench_submit.py
    "$PYTHON" bench_commands.py
    "$PYTHON" bench_latency.py
    "$PYTHON" bench_throughput.py
    "$PYTHON" bench_idle.py --seconds 20
    "$PYTHON" bench_scrape.py
    "$PYTHON" bench_top.py all --runs 20 --seconds 20
    "$PYTHON" bench_big_store.py
    "$PYTHON" bench_retention.py
    "$PYTHON" bench_estimates.py --jobs 20000 --runs 100
    "$PYTHON" bench_preemption.py
    "$PYTHON" bench_services.py --duration-s 1.5 --rounds 2
fi
