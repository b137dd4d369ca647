#!/bin/sh
# The big-queue benchmarks (100,000 jobs): each prints its figures against the same run with a
# small queue. Longer than run_all.sh, so kept apart from it. --quick shrinks each to a smoke run.
# PYTHON and GPUSCHED_BENCH_SRC as in run_all.sh.
set -eu
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
QUICK=""
if [ "${1:-}" = "--quick" ]; then QUICK="--quick"; fi
# One line per benchmark below: "$PYTHON" bench_NAME.py $QUICK
"$PYTHON" bench_bigqueue.py $QUICK
"$PYTHON" bench_bigsubmit.py $QUICK
"$PYTHON" bench_bigls.py $QUICK
"$PYTHON" bench_submit_turns.py $QUICK
