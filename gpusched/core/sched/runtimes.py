"""Runtimes learned from history (pure): a job's predicted runtime from earlier runs, and
the time a running job is expected to end, by its --time or else its prediction.

A prediction never limits a job: it only orders the queue (backfill's reservation) and
forecasts starts (core/sched/forecast.py). A job's real --time, if given, still limits it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from gpusched.core.sched.memestimate import percentile
from gpusched.core.units import duration_human

# The newest successful runs a prediction reads: recent enough to follow a job that
# changed, and enough that one odd run moves the median little (20 did worse in the
# simulator: docs/scheduling.md).
HISTORY_RUNS = 50
# How many runs each level needs before it is trusted: one run of the same job says more
# than a few of the user's other jobs.
MIN_RUNS = {"job": 1, "user": 3, "box": 3}
# The interval's ends: a forecast's 80 % interval runs the queue with each at these.
LOW_PCT, HIGH_PCT = 10.0, 90.0
# A running job past its high end is expected to run on this share of what it has run
# so far (at least FLOOR_S): the remaining time is floored, never zero or negative.
OVERRUN_SHARE = 0.25
FLOOR_S = 60.0


@dataclass(frozen=True)
class Prediction:
    runtime_s: float  # the median of the runs read
    low_s: float  # the LOW_PCT and HIGH_PCT quantiles: the forecast's interval, and the
    high_s: float  # high one is what a reservation would hold
    reason: str  # where it came from, in words; never the job's name (as memestimate)


def predict(
    job_runs: Sequence[float], user_runs: Sequence[float], box_runs: Sequence[float]
) -> Prediction | None:
    """The runtime from the first level with enough runs (newest first, seconds): this
    user's earlier runs of the same job key, else this user's runs of any job, else the
    box's; None when none has enough."""
    levels = (
        ("job", job_runs, "earlier run{s} of this job"),
        ("user", user_runs, "earlier run{s} of this user's jobs (none of this job)"),
        ("box", box_runs, "earlier run{s} on this box (none of this user's)"),
    )
    for level, runs, words in levels:
        recent = [max(float(r), 0.0) for r in runs[:HISTORY_RUNS]]
        if len(recent) < MIN_RUNS[level]:
            continue
        median = float(statistics.median(recent))
        low, high = percentile(recent, LOW_PCT), percentile(recent, HIGH_PCT)
        where = words.format(s="s" if len(recent) != 1 else "")
        return Prediction(
            median,
            low,
            high,
            f"predicted from {len(recent)} {where}: median {duration_human(median)} "
            f"(80 % of runs {duration_human(low)} to {duration_human(high)})",
        )
    return None


def remaining_s(elapsed_s: float, expected_s: float, high_s: float | None = None) -> float:
    """How much longer a run that has run elapsed_s is expected to run, given its expected
    runtime: the rest of it, else the rest of its high end, else a share of what it ran so
    far (a job past its prediction has not ended: it is never expected to end at once)."""
    for total in (expected_s, high_s):
        if total is not None and total - elapsed_s > 0:
            return total - elapsed_s
    return max(FLOOR_S, OVERRUN_SHARE * elapsed_s)


def expected_runtime_s(time_limit_s: float | None, predicted_s: float | None) -> float | None:
    """What scheduling expects a job to run: its --time, else its prediction."""
    return time_limit_s if time_limit_s is not None else predicted_s
