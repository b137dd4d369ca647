"""Write a synthetic two-week, 8-GPU job trace in the Philly trace's columns (bench/traces/).

A second trace to check scheduling figures against, with another mix than Philly's: more
tenants, more 2-GPU jobs, fewer 8-GPU ones, and log-normal durations whose spread grows
with the job's size. Seeded, so the file is the same on every run.
"""

from __future__ import annotations

import argparse
import csv
import math
import random
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from gpusched.sim import traces

OUT = Path(__file__).resolve().parent / "traces" / "synthetic_p8_2wk.csv"
DAYS, JOBS, SEED = 14, 2000, 20261203
ORIGIN = datetime(2026, 1, 5)
# tenant: (share of jobs, {GPUs: share}, median duration in s)
TENANTS = {
    "vision": (0.30, {1: 0.55, 2: 0.20, 4: 0.20, 8: 0.05}, 3 * 3600),
    "speech": (0.15, {1: 0.40, 2: 0.30, 4: 0.25, 8: 0.05}, 2 * 3600),
    "nlp": (0.20, {1: 0.50, 2: 0.10, 4: 0.20, 8: 0.20}, 4 * 3600),
    "rl": (0.15, {1: 0.90, 2: 0.10}, 1800),
    "students": (0.20, {1: 0.85, 2: 0.15}, 900),
}


def draw(rng: random.Random, weights: dict[Any, float]) -> Any:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def rows(seed: int, jobs: int) -> list[tuple[object, ...]]:
    """(job_id, tenant, orig_timestamp, submit_raw_s, num_gpus, duration_s, gpu_time_s) in
    submission order: arrivals follow the working day (three times as many at 14:00 as at
    02:00), durations are log-normal (sigma 1.6), 60 s to 24 h."""
    rng = random.Random(seed)
    shares = {name: spec[0] for name, spec in TENANTS.items()}
    times = []
    while len(times) < jobs:
        t = rng.uniform(0, DAYS * 86400)
        hour = (t % 86400) / 3600
        if rng.random() < (2 - math.cos((hour - 2) / 24 * 2 * math.pi)) / 3:
            times.append(int(t))
    out = []
    for job_id, submit_s in enumerate(sorted(times)):
        tenant = str(draw(rng, shares))
        _, sizes, median_s = TENANTS[tenant]
        gpus = int(str(draw(rng, sizes)))
        duration = int(min(86400, max(60, rng.lognormvariate(math.log(median_s), 1.6))))
        stamp = (ORIGIN + timedelta(seconds=submit_s)).strftime("%Y-%m-%d %H:%M:%S")
        out.append((job_id, tenant, stamp, submit_s, gpus, duration, gpus * duration))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--jobs", type=int, default=JOBS)
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(traces.PHILLY_COLUMNS)
        writer.writerows(rows(args.seed, args.jobs))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
