"""The las discipline: queues by attained GPU time, FIFO inside each, the starvation
guard (core/sched/queuerules.py), its pending reasons, and its preemptions in the
simulator (sim/preemptsim.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gpusched.core.config import settings_from_mapping
from gpusched.core.errors import ConfigError
from gpusched.core.models import GpuInfo, Inventory, Job, JobState, Request
from gpusched.core.sched import placement, preemption, queuerules, scheduling
from gpusched.core.sched.placement import PlacementRules
from gpusched.core.sched.queuerules import QueueRules
from gpusched.sim import preemptsim, traces
from test_simulator import gpusched, history

HOUR_S = 3600.0
LAS = QueueRules(discipline="las", las_thresholds_gpu_s=(HOUR_S, 8 * HOUR_S))


def job(job_id: int, gpus: int = 1, submitted_at: float = 0.0, **fields) -> Job:
    return Job(
        id=job_id,
        command=("true",),
        cwd="/",
        uid=1000,
        user="alice",
        request=Request(gpus=gpus),
        submitted_at=submitted_at,
        **fields,
    )


def order(jobs: list[Job], attained: dict[int, float], now: float, rules=LAS) -> list[int]:
    return [j.id for j in queuerules.queue_order(jobs, rules, {}, now, attained)]


@pytest.mark.unit
def test_a_job_that_attained_less_goes_first_and_submission_orders_a_queue():
    jobs = [job(1), job(2), job(3), job(4)]
    # GPU-seconds of earlier runs: 1 is in the second queue, 4 in the third.
    attained = {1: 2 * HOUR_S, 3: 0.5 * HOUR_S, 4: 9 * HOUR_S}
    assert order(jobs, attained, now=60.0) == [2, 3, 1, 4]


@pytest.mark.unit
def test_attained_service_counts_gpus_times_run_time_and_the_current_run():
    running = replace(job(1, gpus=4), state=JobState.RUNNING, started_at=100.0)
    assert queuerules.attained_gpu_s(running, {1: 50.0}, now=200.0) == 50.0 + 4 * 100.0
    assert queuerules.las_queue(running, LAS, {1: 0.0}, now=100.0 + 899.0) == 0
    assert queuerules.las_queue(running, LAS, {1: 0.0}, now=100.0 + 900.0) == 1  # 1 GPU-h


@pytest.mark.unit
def test_priority_still_comes_first():
    jobs = [job(1), job(2, priority=5)]
    assert order(jobs, {2: 20 * HOUR_S}, now=60.0) == [2, 1]


@pytest.mark.unit
def test_a_job_that_waited_its_factor_times_its_attained_service_moves_to_the_first_queue():
    # Job 1 attained 2 GPU-h and was preempted at t=0; the factor is 4: after 8 h it
    # stands first again, ahead of a newer job that attained nothing.
    jobs = [job(1, preempted_at=0.0), job(2, submitted_at=100.0)]
    attained = {1: 2 * HOUR_S}
    assert order(jobs, attained, now=8 * HOUR_S - 1) == [2, 1]
    assert order(jobs, attained, now=8 * HOUR_S) == [1, 2]


@pytest.mark.unit
def test_the_starvation_guard_waits_at_least_its_floor():
    rules = replace(LAS, las_thresholds_gpu_s=(60.0,))  # 100 GPU-s: the second queue
    jobs = [job(1, preempted_at=0.0), job(2, submitted_at=10.0)]
    # 4 x 100 s is 400 s, but the floor is an hour.
    assert order(jobs, {1: 100.0}, now=1000.0, rules=rules) == [2, 1]
    assert order(jobs, {1: 100.0}, now=HOUR_S, rules=rules) == [1, 2]


@pytest.mark.unit
def test_outranks_compares_queues_at_one_priority_only():
    short, long = job(2), replace(job(1), state=JobState.RUNNING, started_at=0.0)
    now = 2 * HOUR_S
    assert queuerules.outranks(short, long, LAS, {}, now)
    assert not queuerules.outranks(long, short, LAS, {}, now)
    assert not queuerules.outranks(short, replace(long, priority=1), LAS, {}, now)
    assert not queuerules.outranks(short, long, QueueRules(), {}, now)  # fifo: priority only


@pytest.mark.unit
def test_the_pending_reason_names_the_queue():
    gpu = GpuInfo(0, "GPU-0", "Simulated", 80 * 2**30, 0, 0.0)
    inventory = Inventory((gpu,))
    rules = PlacementRules()
    running = [replace(job(9), state=JobState.RUNNING, started_at=0.0, gpu_uuids=("GPU-0",))]
    loads = placement.gpu_loads(inventory, running, {}, rules)
    plan = scheduling.schedule(
        [job(1), job(2)], running, loads, inventory, rules, LAS, now=60.0, attained={1: 2 * HOUR_S}
    )
    assert plan.reasons[2].startswith("las queue 1 of 3; ")
    assert plan.reasons[1].startswith("las queue 2 of 3; ")


def replay(path, gpus: int, model=None, **las) -> tuple[dict[str, tuple], int]:
    results, sim = preemptsim.replay_with_priorities(
        traces.load_trace(path).jobs,
        gpus=gpus,
        urgent=frozenset(),
        model=model or preemptsim.PreemptionModel(),
        policy="pack",
        queue=replace(LAS, **las),
    )
    return {r.job_id: (r.start_s, r.end_s) for r in results}, sim.preemptions


@pytest.mark.unit
def test_a_short_job_preempts_a_long_one_that_attained_more_and_the_long_one_resumes(tmp_path):
    path = history(tmp_path, [("long", "u", 0, 1, 10 * HOUR_S), ("short", "v", 7200, 1, 600)])
    times, count = replay(path, 1)
    assert count == 1
    # The short job starts once the long one's 60 s grace is over; the long one then
    # resumes with its work left plus 60 s to restart.
    assert times["short"] == (7260, 7860)
    assert times["long"] == (0, 7860 + (10 * HOUR_S - 7260) + 60)


@pytest.mark.unit
def test_a_job_leaving_the_first_queue_is_preempted_for_one_that_waits(tmp_path):
    # The short job waits from 30 min: not preempted in the first queue, the long job is
    # at 1 h, when it enters the second.
    path = history(tmp_path, [("long", "u", 0, 1, 3 * HOUR_S), ("short", "v", 1800, 1, 600)])
    times, count = replay(path, 1)
    assert count == 1 and times["short"][0] == HOUR_S + 60


@pytest.mark.unit
def test_las_max_preemptions_is_respected(tmp_path):
    rows = [("long", "u", 0, 1, 20 * HOUR_S)]
    rows += [(f"s{n}", "v", 7200 + n * 3600, 1, 600) for n in range(5)]
    path = history(tmp_path, rows)
    _, count = replay(path, 1)
    assert count == 5  # no limit by default
    rules = preemption.PreemptionRules(las_max_preemptions=2)
    _, count = replay(path, 1, preemptsim.PreemptionModel(rules=rules))
    assert count == 2


@pytest.mark.unit
def test_a_big_job_that_waited_long_preempts_smaller_jobs_of_its_queue(tmp_path):
    # Four 1-GPU jobs, each 2 h, take the box as they arrive ahead of the 4-GPU one, and
    # keep coming: the 4-GPU job, in the first queue as they are, preempts them once it
    # has waited las_preempt_smaller_after (1 h here). (None leaves the first queue.)
    rows = [(f"s{n}", "u", n * 1800, 1, 2 * HOUR_S) for n in range(12)]
    rows.append(("big", "v", 60, 4, 600))
    path = history(tmp_path, rows)
    times, count = replay(
        path, 4, las_thresholds_gpu_s=(9 * HOUR_S,), las_preempt_smaller_after_s=HOUR_S
    )
    assert count > 0 and times["big"][0] < 2 * HOUR_S
    times, count = replay(
        path, 4, las_thresholds_gpu_s=(9 * HOUR_S,), las_preempt_smaller_after_s=0.0
    )
    assert times["big"][0] > 2 * HOUR_S


@pytest.mark.unit
def test_the_config_takes_the_queues_bounds_as_durations_in_ascending_order():
    settings = settings_from_mapping({"scheduling": {"las_thresholds": ["30m", "2h", "1d"]}}, "t")
    assert settings.las_thresholds_gpu_s == (1800.0, 7200.0, 86400.0)
    with pytest.raises(ConfigError, match="las_thresholds"):
        settings_from_mapping({"scheduling": {"las_thresholds": ["8h", "1h"]}}, "t")


@pytest.mark.e2e
def test_simulate_las_reports_the_preemptions_and_the_gpu_time_they_lost(tmp_path):
    path = history(tmp_path, [("long", "u", 0, 1, 10 * HOUR_S), ("short", "v", 7200, 1, 600)])
    proc = gpusched("simulate", str(path), "--gpus", "1", "--discipline", "las", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["discipline"] == "las" and report["preemptions"] == 1
    assert report["preemptions_per_job"] == 0.5
    # One 60 s restart of a 1-GPU job, of 10 h 10 min of work.
    assert report["lost_gpu_share"] == pytest.approx(60 / (10 * HOUR_S + 600 + 60))
    table = gpusched("simulate", str(path), "--gpus", "1", "--discipline", "las").stdout
    assert "GPU time lost to restarts" in table
    refused = gpusched("simulate", str(path), "--discipline", "las", "--cpus", "4")
    assert refused.returncode == 2
    assert refused.stderr.startswith("Error: --discipline las replays with preemption")
