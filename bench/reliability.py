#!/usr/bin/env python3
"""Reliability figures from one run: real daemons in temporary homes on simulated GPUs,
driven through the real console script, pushed by concurrent submitters, SIGKILLs, a
full disk, damaged queue files, malformed requests and other users.

Every figure under "failures" counts something that went wrong and should read 0.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_note
from reliability import (
    attack_notify,
    attack_privacy,
    attack_quota,
    attack_requestlog,
    attack_stop,
    corrupt,
    crashpoints,
    diskfull,
    kills,
    malformed,
    submitters,
    unauthorized,
)
from reliability.harness import Figures

PARTS = (
    "submitters",
    "kills",
    "crashpoints",
    "diskfull",
    "corrupt",
    "malformed",
    "unauthorized",
    "stops",
    "notify",
    "requestlog",
    "privacy",
    "quota",
)
# (submitters, submits each, kill rounds, crash points) for a full run and for CI.
FULL = (16, 200, 3, 40)
SMALL = (4, 10, 1, 3)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--small",
        action="store_true",
        help="the CI size: 4 x 10 submitters, 1 kill round, 3 crash points",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the crash points' timing (default: random, printed)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--parts", default="", help="only these parts, comma-separated: " + ", ".join(PARTS)
    )
    return parser.parse_args(argv)


def run_parts(args: argparse.Namespace) -> dict[str, Figures]:
    workers, each, rounds, points = SMALL if args.small else FULL
    jobs = {  # in PARTS order
        "submitters": lambda: submitters.measure(workers, each),
        "kills": lambda: kills.measure(rounds),
        "crashpoints": lambda: crashpoints.measure(points, args.seed),
        "diskfull": lambda: diskfull.measure(),
        "corrupt": lambda: corrupt.measure(),
        "malformed": lambda: malformed.measure(args.small),
        "unauthorized": lambda: unauthorized.measure(),
        # The attacks of issue 32 that can be automated (docs/security.md).
        "stops": lambda: attack_stop.measure(args.small),
        "notify": lambda: attack_notify.measure(args.small),
        "requestlog": lambda: attack_requestlog.measure(args.small),
        "privacy": lambda: attack_privacy.measure(args.small),
        "quota": lambda: attack_quota.measure(args.small),
    }
    chosen = [p.strip() for p in args.parts.split(",") if p.strip()] or list(jobs)
    unknown = set(chosen) - set(jobs)
    if unknown:
        raise SystemExit(
            f"unknown part(s) {', '.join(sorted(unknown))}; choose from: {', '.join(jobs)}"
        )

    # The parts wait on daemons and jobs far more than they compute: run them side by side.
    def timed(name: str) -> Figures:
        started = time.monotonic()
        fig = jobs[name]()
        fig.info["seconds"] = round(time.monotonic() - started)
        return fig

    with ThreadPoolExecutor(len(chosen)) as pool:
        return dict(zip(chosen, pool.map(timed, chosen)))


def print_table(parts: list[Figures], seed: int, elapsed_s: float) -> None:
    """One line per part: what it measured, and its failure counts."""
    print(f"gpusched reliability ({machine_note()}; seed {seed}; {elapsed_s:.0f} s)")
    rows = []
    for fig in parts:
        if fig.skipped:
            rows.append((fig.title, "skipped", fig.skipped))
            continue
        context = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in fig.info.items())
        failures = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in fig.counts.items())
        rows.append((fig.title, context, failures))
    header = ("part", "measured", "failures (each should be 0)")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(2)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)) + "  " + header[2])
    print("  ".join("-" * w for w in widths) + "  " + "-" * len(header[2]))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[2])
    notes = [f"  {fig.title}: {note}" for fig in parts for note in fig.notes]
    if notes:
        print("\nWhat failed (first of each part):")
        print("\n".join(notes))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(10**6)
    started = time.monotonic()
    parts = run_parts(args)
    elapsed_s = time.monotonic() - started
    if args.json:
        print(
            json.dumps(
                {
                    "seed": args.seed,
                    "small": args.small,
                    "seconds": round(elapsed_s),
                    "parts": {name: fig.as_json() for name, fig in parts.items()},
                },
                indent=1,
            )
        )
    else:
        print_table(list(parts.values()), args.seed, elapsed_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
