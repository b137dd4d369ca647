#!/bin/sh
# Run every benchmark in turn: under 5 minutes in all (about 4 on 2 cores; each one's
# seconds and the total are printed). --quick shrinks each to a smoke run (about a
# minute and a half in all).
# PYTHON=path/to/venv/bin/python picks the interpreter (default: python3 on PATH, e.g. an
# activated venv); gpusched is the console script beside it.
# GPUSCHED_BENCH_SRC=DIR benchmarks gpusched from another checkout instead.
set -eu
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
START=$(date +%s)
# Each benchmark, then the seconds it took (the whole run must stay under 5 minutes).
run() {
    begun=$(date +%s)
    "$PYTHON" "$@"
    echo "[$1: $(( $(date +%s) - begun )) s]"
}
if [ "${1:-}" = "--quick" ]; then
    run bench_submit.py --runs 10 --ls-runs 5
    run bench_commands.py --runs 5
    run bench_latency.py --runs 10
    run bench_submit_burst.py --clients 20 --each 20 --rounds 1 --tsp-each 2
    run bench_throughput.py --jobs 100 --rounds 1
    run bench_idle.py --seconds 10
    run bench_scrape.py --runs 30
    run bench_top.py all --runs 20 --seconds 10 --warmup 3
    run bench_big_store.py --jobs 20000 --runs 5 --idle-seconds 5
    run bench_retention.py --jobs 20000
    run bench_estimates.py --fifo-only --jobs 5000 --runs 20
    run bench_preemption.py --seeds 1
    run bench_services.py --duration-s 1 --rounds 1
else
    run bench_submit.py
    run bench_commands.py
    run bench_latency.py
    run bench_submit_burst.py --rounds 3 --tsp-each 5
    run bench_throughput.py
    run bench_idle.py --seconds 15
    run bench_scrape.py
    run bench_top.py all --runs 10 --seconds 10 --warmup 3
    run bench_big_store.py --runs 10
    run bench_retention.py
    run bench_estimates.py --jobs 20000 --runs 100
    run bench_preemption.py
    run bench_services.py --duration-s 1.5 --rounds 1
fi
echo "[all: $(( $(date +%s) - START )) s]"
