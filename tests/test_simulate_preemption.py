"""`gpusched simulate --preemption`: the replay with urgent jobs and preemption
(sim/preemptsim.py), through core/preemption.choose_victims as the daemon."""

from __future__ import annotations

import json

import pytest

from gpusched.sim import preemptsim, simulator, traces
from test_simulator import PHILLY, gpusched, history, needs_philly


def replay(path, gpus: int, urgent: set[int], preemption: bool) -> dict[str, tuple]:
    results, count = preemptsim.simulate_with_priorities(
        traces.load_trace(path).jobs,
        gpus=gpus,
        urgent=frozenset(urgent),
        model=preemptsim.PreemptionModel() if preemption else None,
    )
    return {r.job_id: (r.start_s, r.end_s) for r in results}, count


def test_an_urgent_job_preempts_after_the_grace_and_the_victim_finishes_its_work(tmp_path):
    path = history(tmp_path, [("low", "u", 0, 1, 10_000), ("urgent", "v", 1000, 1, 100)])
    waited, none = replay(path, 1, {1}, preemption=False)
    assert none == 0 and waited["urgent"] == (10_000, 10_100)
    times, count = replay(path, 1, {1}, preemption=True)
    assert count == 1
    # It starts once the victim's 60 s grace is over; the victim then has 8,940 s of work
    # left, plus 60 s to restart.
    assert times["urgent"] == (1060, 1160)
    assert times["low"] == (0, 1160 + 8940 + 60)


def test_a_job_is_not_preempted_in_its_first_five_minutes(tmp_path):
    path = history(tmp_path, [("low", "u", 0, 1, 10_000), ("urgent", "v", 100, 1, 100)])
    times, _ = replay(path, 1, {1}, preemption=True)
    assert times["urgent"] == (300 + 60, 300 + 60 + 100)


def test_the_urgent_job_gets_the_held_gpus_before_a_lower_one(tmp_path):
    # Two victims on two GPUs; one ends by itself during the grace. The small job that
    # arrives then must not take its GPU from the urgent two-GPU job.
    path = history(
        tmp_path,
        [
            ("a", "u", 0, 1, 1030),
            ("b", "u", 0, 1, 10_000),
            ("urgent", "v", 1000, 2, 100),
            ("small", "w", 1031, 1, 50),
        ],
    )
    times, count = replay(path, 2, {2}, preemption=True)
    assert count == 2
    assert times["urgent"] == (1060, 1160)
    assert times["small"][0] >= 1160


@needs_philly
def test_without_preemption_or_priorities_the_reference_figure_stands():
    trace = traces.prepare(PHILLY, gpus=8, load=0.5, arrivals="trace", seed=0)
    results, count = preemptsim.simulate_with_priorities(
        trace.jobs, gpus=8, urgent=frozenset(), model=preemptsim.PreemptionModel()
    )
    assert count == 0
    avg_jct_h = simulator.compute_metrics(results, 8).avg_jct_s / 3600
    assert round(avg_jct_h, 3) == 13.364


@pytest.mark.e2e
@needs_philly
def test_cli_reports_the_urgent_jobs_with_and_without_preemption():
    runs = {}
    for flag in ("--preemption", "--high-priority-share=0.1"):
        proc = gpusched("simulate", str(PHILLY), "--load", "0.5", "--json", flag)
        assert proc.returncode == 0, proc.stderr
        runs[flag] = json.loads(proc.stdout)
    on, off = runs["--preemption"], runs["--high-priority-share=0.1"]
    assert on["high_priority"]["jobs"] == off["high_priority"]["jobs"] == 182
    assert on["preemptions"] > 0 and off["preemptions"] == 0
    assert on["high_priority"]["avg_jct_s"] < off["high_priority"]["avg_jct_s"]
    assert (
        on["high_priority"]["avg_bounded_slowdown"] < off["high_priority"]["avg_bounded_slowdown"]
    )


@pytest.mark.e2e
def test_cli_refuses_a_share_outside_0_to_1(tmp_path):
    path = history(tmp_path, [("a", "u", 0, 1, 10)])
    proc = gpusched("simulate", str(path), "--high-priority-share", "1.5")
    assert proc.returncode == 2
    assert proc.stderr == "Error: --high-priority-share must be between 0 and 1, not 1.5\n"
