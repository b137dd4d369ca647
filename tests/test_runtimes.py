"""Runtimes learned from history (core/sched/runtimes.py) and the start forecast of pending
jobs (core/sched/forecast.py): pure."""

from __future__ import annotations

import json
import math

import pytest

from conftest import wait_until
from gpusched.core.models import GpuInfo, Inventory, Job, JobState, Request
from gpusched.core.sched import forecast, placement, runtimes, scheduling
from gpusched.core.sched.passcounts import expected_end
from gpusched.core.sched.placement import PlacementRules
from gpusched.core.sched.queuerules import QueueRules
from gpusched.daemon.jobs import forecasts
from gpusched.daemon.requests import queries
from gpusched.sim import runtimesim, traces
from gpusched.store.database import Store
from test_simulator import gpusched, history

HOUR_S = 3600.0


@pytest.mark.unit
def test_the_same_jobs_runs_come_first_then_the_users_then_the_boxs():
    job_runs, user_runs, box_runs = [100.0, 300.0, 200.0], [10.0] * 5, [1.0] * 5
    by_job = runtimes.predict(job_runs, user_runs, box_runs)
    assert by_job is not None and by_job.runtime_s == 200.0  # the median
    assert "3 earlier runs of this job" in by_job.reason
    by_user = runtimes.predict([], user_runs, box_runs)
    assert by_user is not None and by_user.runtime_s == 10.0
    assert "this user's jobs" in by_user.reason
    # Two of the user's runs are too few: the box's history answers.
    by_box = runtimes.predict([], [10.0, 10.0], box_runs)
    assert by_box is not None and by_box.runtime_s == 1.0 and "on this box" in by_box.reason
    assert runtimes.predict([], [10.0], [1.0, 1.0]) is None


@pytest.mark.unit
def test_a_prediction_reads_the_newest_runs_only_and_gives_the_quantiles():
    # Newest first: 50 runs of 10 s to 500 s, then an old one of a day that is not read.
    runs = [10.0 * n for n in range(1, 51)] + [86400.0]
    assert runtimes.HISTORY_RUNS == 50
    got = runtimes.predict(runs, [], [])
    assert got is not None
    assert got.runtime_s == 255.0  # median of 10..500
    assert (got.low_s, got.high_s) == (50.0, 450.0)  # nearest rank: p10, p90
    assert runtimes.percentile([5.0], 90.0) == 5.0


@pytest.mark.unit
def test_a_running_jobs_remaining_time_is_floored():
    assert runtimes.remaining_s(elapsed_s=60.0, expected_s=100.0, high_s=300.0) == 40.0
    # Past its median: the rest of its high end.
    assert runtimes.remaining_s(elapsed_s=200.0, expected_s=100.0, high_s=300.0) == 100.0
    # Past both: a quarter of what it ran, at least a minute; never 0.
    assert runtimes.remaining_s(elapsed_s=400.0, expected_s=100.0, high_s=300.0) == 100.0
    assert runtimes.remaining_s(elapsed_s=120.0, expected_s=100.0) == runtimes.FLOOR_S


def job(job_id: int, gpus: int = 1, **fields) -> Job:
    return Job(
        id=job_id,
        command=("true",),
        cwd="/",
        uid=1000,
        user="alice",
        request=Request(gpus=gpus),
        submitted_at=0.0,
        **fields,
    )


def predicted(job_id: int, gpus: int, median: float, low: float, high: float, **fields) -> Job:
    return job(
        job_id, gpus, predicted_s=median, predicted_low_s=low, predicted_high_s=high, **fields
    )


def box(gpus: int) -> Inventory:
    return Inventory(
        tuple(
            GpuInfo(
                index=i,
                uuid=f"GPU-{i}",
                name="sim",
                mem_total_bytes=80 * 2**30,
                mem_used_bytes=0,
                util_pct=0.0,
            )
            for i in range(gpus)
        )
    )


@pytest.mark.unit
def test_backfill_reserves_with_the_prediction_of_a_job_without_time():
    # A job with no --time but a prediction of an hour is expected to end in an hour; with
    # neither, never (backfill cannot reserve behind it).
    assert expected_end(job(1, predicted_s=HOUR_S), now=100.0) == 100.0 + HOUR_S
    assert expected_end(job(1), now=100.0) == math.inf
    # What a reservation counts on for a running job: the high end of its prediction.
    sure = job(1, predicted_s=HOUR_S, predicted_high_s=2 * HOUR_S)
    assert expected_end(sure, now=100.0, reserving=True) == 100.0 + 2 * HOUR_S
    # --time wins over a prediction: it is the limit.
    assert expected_end(job(1, time_limit_s=60.0, predicted_s=HOUR_S), now=0.0) == 60.0


@pytest.mark.unit
@pytest.mark.parametrize("discipline", ["fifo", "backfill", "fairshare", "sjf", "las"])
def test_the_forecast_of_a_hand_made_queue(discipline):
    # Two GPUs, t = 1000. Running: job 1 on GPU-0 since t = 0, predicted 1500 s (80 % of
    # its runs 1100 to 2000 s): it ends at 1500 (low run: 1100; high run: 2000). Job 2 on
    # GPU-1 has neither a prediction nor a --time: as far as anyone knows it never ends.
    # Pending, in order: job 3 wants 1 GPU for 600 s (300 to 900): it starts when job 1
    # ends, 1500 (low run 1100, high run 2000). Job 4 wants 1 GPU and follows job 3:
    # 1500 + 600 = 2100 (low run 1100 + 300 = 1400; high run 2000 + 900 = 2900). Job 5
    # wants both GPUs: job 2 never ends, so it gets no forecast.
    inventory, rules, now = box(2), PlacementRules(), 1000.0
    running = [
        predicted(
            1,
            1,
            1500.0,
            1100.0,
            2000.0,
            state=JobState.RUNNING,
            started_at=0.0,
            gpu_uuids=("GPU-0",),
        ),
        job(2, state=JobState.RUNNING, started_at=0.0, gpu_uuids=("GPU-1",)),
    ]
    pending = [
        predicted(3, 1, 600.0, 300.0, 900.0),
        predicted(4, 1, 600.0, 300.0, 900.0),
        job(5, gpus=2, predicted_s=60.0),
    ]
    loads = placement.gpu_loads(inventory, running, {}, rules)
    # One user, no --time, nothing attained: every discipline keeps them in this order.
    queue = QueueRules(discipline=discipline)
    got = forecast.forecasts(pending, running, loads, inventory, rules, queue, now)
    assert got == {
        3: forecast.Forecast(1500.0, 1100.0, 2000.0),
        4: forecast.Forecast(2100.0, 1400.0, 2900.0),
    }


@pytest.mark.unit
def test_a_forecast_counts_begin_times_and_a_time_limit():
    # One free GPU at t = 0. Job 1 may not begin before t = 500: it starts then, and runs
    # its --time of 100 s (shorter than its prediction). Job 2 follows at 600.
    inventory, rules = box(1), PlacementRules()
    pending = [
        predicted(1, 1, 1000.0, 900.0, 1100.0, begin_time=500.0, time_limit_s=100.0),
        predicted(2, 1, 50.0, 50.0, 50.0),
    ]
    loads = placement.gpu_loads(inventory, [], {}, rules)
    starts = forecast.dry_run(pending, [], loads, inventory, rules, QueueRules(), 0.0)
    # Job 2 fits before job 1's begin time: fifo's skip-ahead starts it at once.
    assert starts == {2: 0.0, 1: 500.0}
    backfill = QueueRules(discipline="backfill")
    assert forecast.dry_run(pending, [], loads, inventory, rules, backfill, 0.0) == starts
    assert scheduling.schedule(pending, [], loads, inventory, rules, backfill, 0.0).starts


def run_for(box, seconds: float, *argv: str) -> int:
    """A job submitted, started at once, and succeeded `seconds` later."""
    job_id = box.submit(*argv)
    box.step()
    assert box.show(job_id)["state"] == "running"
    assert box.exit(job_id, 0, seconds=seconds)["state"] == "succeeded"
    return job_id


@pytest.mark.inproc
def test_backfill_orders_by_predicted_runtimes_and_ls_start_forecasts_them(make_box):
    box = make_box("2x80GiB", '[scheduling]\ndiscipline = "backfill"\n')
    for _ in range(3):
        run_for(box, 60.0, "--gpus", "1", "--name", "short", "--", "true")
        run_for(box, HOUR_S, "--gpus", "1", "--name", "long", "--", "true")
    # A long job runs on one GPU; a two-GPU job waits for it: backfill reserves both GPUs
    # for it at the long job's predicted end, an hour from now.
    long_id = box.submit("--gpus", "1", "--name", "long", "--time", "auto", "--", "true")
    box.step()
    started = box.clock.time()
    wide = box.submit("--gpus", "2", "--name", "wide", "--", "true")
    box.step(100.0)
    shown = box.show(long_id)
    assert shown["time_limit_s"] is None and shown["predicted_s"] == HOUR_S
    assert "3 earlier runs of this job" in shown["runtime_reason"]
    # Another long one would end after that reservation; a short one ends before it.
    late = box.submit("--gpus", "1", "--name", "long", "--", "true")
    short = box.submit("--gpus", "1", "--name", "short", "--", "true")
    box.step()
    assert box.states(late, short) == ["pending", "running"]
    assert "would delay job" in box.show(late)["pending_reason"]
    # ls --start: the wide job starts at the long one's predicted end, the late one after it.
    rows = {row["id"]: row for row in box.call("list", start=True, states=["pending"])["jobs"]}
    assert rows[wide]["start_forecast"] == started + HOUR_S
    assert rows[wide]["start_low"] <= rows[wide]["start_forecast"] <= rows[wide]["start_high"]
    assert rows[late]["start_forecast"] > rows[wide]["start_forecast"]
    # The clock moves past the long job's prediction: it is not killed, and the forecast
    # moves with it (the remaining time, floored: a quarter of what it has run).
    box.exit(short, 0, seconds=60.0)
    box.step(HOUR_S)
    assert box.show(long_id)["state"] == "running"
    ran_s = box.clock.time() - started
    assert box.show(wide)["start_forecast"] == box.clock.time() + ran_s * runtimes.OVERRUN_SHARE


def test_a_forecast_is_kept_while_the_queue_stays_the_same(make_box, monkeypatch):
    # A client that polls `show` of a pending job (a watch of `gpusched mcp`) must not cost
    # the loop a dry run of the queue each time.
    made = []
    real = forecasts.start_forecasts
    monkeypatch.setattr(forecasts, "start_forecasts", lambda *a: made.append(1) or real(*a))
    box = make_box("1x80GiB")
    running = box.submit("--gpus", "1", "--", "true")
    first, second = (box.submit("--gpus", "1", "--", "true") for _ in range(2))
    box.step()
    for _ in range(3):
        assert box.show(second)["state"] == "pending"
    assert len(made) == 1
    box.step(queries.FORECAST_KEPT_S + 1)  # kept no longer than that
    box.show(second)
    assert len(made) == 2
    box.exit(running, 0)  # the queue changed: a new forecast at once
    assert box.states(first, second) == ["running", "pending"]
    assert len(made) == 3


def tiny_trace(tmp_path):
    # One GPU, one user, one key. a runs 0-1000; b comes as a ends and starts at once. At
    # c's submission (1500) a's 1000 s is the history: b is expected to end at 2000, c to
    # start then (it does: exact). d (1600) follows c: forecast 3000, real 3000. e (1700)
    # follows d: forecast 4000, real 4000, but runs 2000 s, not the 1000 predicted, so f
    # (1800), forecast at 5000, starts at 6000: an error of 1000 s in a wait of 4200 s,
    # outside the interval (every run so far took 1000 s: it is [5000, 5000]).
    rows = [("a", "u", 0, 1, 1000), ("b", "u", 1000, 1, 1000), ("c", "u", 1500, 1, 1000)]
    rows += [("d", "u", 1600, 1, 1000), ("e", "u", 1700, 1, 2000), ("f", "u", 1800, 1, 1000)]
    return history(tmp_path, rows)


@pytest.mark.unit
def test_simulate_forecast_weighs_each_forecast_against_the_real_start(tmp_path):
    trace = traces.load_trace(tiny_trace(tmp_path)).jobs
    results, report = runtimesim.replay(
        trace, gpus=1, rules=PlacementRules(), discipline="fifo", predicted=True, with_forecast=True
    )
    assert [r.start_s for r in results] == [0, 1000, 2000, 3000, 4000, 6000]
    assert report == runtimesim.ForecastReport(
        jobs=4, median_error_share=0.0, within_interval=0.75, unknown=0
    )


@pytest.mark.e2e
def test_simulate_prints_the_forecasts_figures_and_refuses_a_bad_runtimes(tmp_path):
    path = str(tiny_trace(tmp_path))
    proc = gpusched("simulate", path, "--gpus", "1", "--runtimes", "predicted", "--forecast")
    assert proc.returncode == 0, proc.stderr
    assert "  runtimes: predicted\n" in proc.stdout
    assert (
        "start forecasts, over the 4 jobs that waited 60 s or more: median error 0.0 % of "
        "the real wait; real start within the 80 % interval 75.0 %" in proc.stdout
    )
    proc = gpusched("simulate", path, "--gpus", "1", "--forecast", "--json")
    assert json.loads(proc.stdout)["forecast"]["jobs"] == 4
    proc = gpusched("simulate", path, "--gpus", "1", "--runtimes", "guessed")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "Error: --runtimes 'guessed': choose one of true, predicted"
    proc = gpusched("simulate", path, "--gpus", "1", "--forecast", "--discipline", "las")
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith("leave out --discipline las")


@pytest.mark.e2e
def test_ls_start_and_show_forecast_a_pending_job_and_a_wrong_prediction_kills_nothing(home):
    ids = [home.submit("--gpus", "4", "--name", "hog", "--", "true") for _ in range(3)]
    for job_id in ids:
        home.wait_state(job_id, "succeeded")
    # Its runs took about no time: this one, which runs on, is far past its prediction.
    hog = home.submit("--gpus", "4", "--name", "hog", "--time", "auto", "--", "sleep", "60")
    home.wait_state(hog, "running")
    waiting = home.submit("--gpus", "1", "--name", "next", "--", "true")
    shown = home.run("show", str(hog)).stdout
    assert "time_limit=-" in shown and "predicted_time=" in shown
    assert "runtime_reason=predicted from 3 earlier runs of this job: median" in shown
    rows = home.json("ls", "--start")
    assert [row["id"] for row in rows] == [waiting]
    assert rows[0]["start_low"] <= rows[0]["start_forecast"] <= rows[0]["start_high"]
    table = home.run("ls", "--start").stdout.splitlines()
    assert table[0].split() == ["JOBID", "USER", "NAME", "START", "80%", "FROM", "80%", "TO"]
    assert table[1].split()[:3] == [str(waiting), home.show(waiting)["user"], "next"]
    assert "start_forecast=20" in home.run("show", str(waiting)).stdout
    wait_until(
        lambda: home.json("ls", "--start")[0]["start_forecast"] > rows[0]["start_forecast"],
        "a forecast that moves on with the overrunning job",
    )
    assert home.show(hog)["state"] == "running"
    home.run("cancel", str(hog))
    home.wait_state(waiting, "succeeded")


def test_the_runs_a_prediction_reads_are_found_by_index_however_long_the_queue(tmp_path):
    # A prediction is made at each submit: a walk of the table past every pending job, by
    # id, made 100 clients submitting at once four times slower (bench_submit_burst.py).
    store = Store(tmp_path / "queue.db")
    plans = []
    for uid, key in ((1000, "train.py"), (1000, None), (None, None)):
        seen: list[str] = []
        store._conn.set_trace_callback(seen.append)
        store.run_seconds(50, uid, key)
        store._conn.set_trace_callback(None)
        (sql,) = [s for s in seen if s.startswith("SELECT")]
        plan = store._conn.execute("EXPLAIN QUERY PLAN " + sql).fetchall()
        plans.append(" ".join(str(row[3]) for row in plan))
    store.close()
    assert all("USING INDEX jobs_runs" in plan for plan in plans), plans
