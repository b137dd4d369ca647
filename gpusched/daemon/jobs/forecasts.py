"""Runtimes learned from history at submit (core/sched/runtimes.py), and the start forecast
of the pending jobs for `ls --start` and `show` (core/sched/forecast.py): one forecast per
request, on the daemon's own queue and placement code."""

from __future__ import annotations

import itertools
from typing import Any

from gpusched.core.sched import forecast, placement, queuerules, runtimes
from gpusched.daemon.state import DaemonState, Setup
from gpusched.store.database import Store


def predicted_fields(store: Store, uid: int, key: str) -> dict[str, Any]:
    """The Job fields of a prediction for this user's job key ({} without enough
    history): the same job's runs, else the user's, else the box's, read only as needed."""
    count = runtimes.HISTORY_RUNS
    job_runs = store.run_seconds(count, uid, key) if key else []
    user_runs: list[float] = []
    box_runs: list[float] = []
    if len(job_runs) < runtimes.MIN_RUNS["job"]:
        user_runs = store.run_seconds(count, uid)
        if len(user_runs) < runtimes.MIN_RUNS["user"]:
            box_runs = store.run_seconds(count)
    got = runtimes.predict(job_runs, user_runs, box_runs)
    if got is None:
        return {}
    return {
        "predicted_s": got.runtime_s,
        "predicted_low_s": got.low_s,
        "predicted_high_s": got.high_s,
        "runtime_reason": got.reason,
    }


def start_forecasts(state: DaemonState, setup: Setup) -> dict[int, forecast.Forecast]:
    """Job id -> forecast start of the first pending jobs in line (forecast.MAX_JOBS)."""
    if not state.pending_count():
        return {}
    now, rules = setup.clock.time(), setup.rules
    queue = setup.queue_rules(state.draining)
    if queue.draining:
        return {}  # nothing starts until `gpusched resume`
    running = state.running()
    loads = placement.gpu_loads(
        state.inventory, running, state.pid_jobs, rules, state.idle_since, now
    )
    share = queuerules.fair_share(queue, state.usage.usage)
    first = list(itertools.islice(state.pending_in_order(share), forecast.MAX_JOBS))
    return forecast.forecasts(
        first,
        running,
        loads,
        state.inventory,
        rules,
        queue,
        now,
        state.usage.usage,
        state.attained,
        reserved=state.reservations,
    )


def add_forecasts(rows: list[dict[str, Any]], found: dict[int, forecast.Forecast]) -> None:
    """Each pending row's forecast start and 80 % interval (None where there is none)."""
    for row in rows:
        if row["state"] != "pending":
            continue
        got = found.get(row["id"])
        row["start_forecast"] = got.start if got else None
        row["start_low"] = got.low if got else None
        row["start_high"] = got.high if got else None
