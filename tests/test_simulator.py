"""The trace simulator: reference rows, hand-checked schedules, metrics, trace input, the CLI."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gpusched.core.errors import GpuschedError, UsageError
from gpusched.core.sched.queuerules import HostCapacity
from gpusched.sim import simulator, traces
from gpusched.sim.simulator import JobResult, simulate

REPO = Path(__file__).resolve().parent.parent
# CI clones the repo at X/main next to X/shared; the trace is shared, not committed.
PHILLY = REPO.parent / "shared" / "traces" / "philly_p8_2wk.csv"
needs_philly = pytest.mark.skipif(
    not PHILLY.exists(), reason=f"shared trace {PHILLY} is absent (not in this checkout)"
)
HOUR_S = 3600.0


def history(tmp_path: Path, rows: list[tuple], name: str = "h.csv") -> Path:
    """A trace in the history format: (job_id, user, submit_s, num_gpus, duration_s[, mem])."""
    mem = any(len(r) > 5 for r in rows)
    header = "job_id,user,submit_s,num_gpus,duration_s" + (",gpu_mem_bytes" if mem else "")
    lines = [header] + [",".join(str(c) for c in r) for r in rows]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def run(path: Path, gpus: int, discipline: str, policy: str = "pack") -> dict[str, JobResult]:
    results = simulator.simulate(
        traces.load_trace(path).jobs, gpus=gpus, policy=policy, discipline=discipline
    )
    return {r.job_id: r for r in results}


def jcts(results: dict[str, JobResult]) -> dict[str, float]:
    return {job_id: r.jct_s for job_id, r in results.items()}


# --- the trace README's reference rows ----------------------------------------------------


@pytest.fixture(scope="module")
def philly_at_half_load() -> traces.Trace:
    return traces.prepare(PHILLY, gpus=8, load=0.5, arrivals="trace", seed=0)


@needs_philly
def test_philly_window_is_fourteen_days_and_scale_matches_the_readme(philly_at_half_load):
    assert traces.load_trace(PHILLY).window_s == 14 * 86400
    assert len(philly_at_half_load.jobs) == 1822
    assert round(philly_at_half_load.arrival_scale, 3) == 8.590


@needs_philly
@pytest.mark.parametrize(
    "discipline, avg_jct_h, avg_wait_h",
    [
        ("fifo", 13.364, 11.121),  # FIFO order, start any job that fits (skip-ahead)
        ("sjf", 7.888, 5.645),  # non-preemptive shortest-job-first with exact durations
    ],
)
def test_reproduces_the_reference_rows(philly_at_half_load, discipline, avg_jct_h, avg_wait_h):
    results = simulator.simulate(philly_at_half_load.jobs, gpus=8, discipline=discipline)
    metrics = simulator.compute_metrics(results, 8)
    assert f"{metrics.avg_jct_s / HOUR_S:.3f}" == f"{avg_jct_h:.3f}"
    assert f"{metrics.avg_wait_s / HOUR_S:.3f}" == f"{avg_wait_h:.3f}"


@needs_philly
def test_easy_backfill_matches_the_readme_figure(philly_at_half_load):
    # 12.60 h needs EASY's "extra GPUs": a long job may take a GPU the reserved job will
    # not need at its reserved start. Reserving every soonest-free GPU gave 12.88 h.
    results = simulator.simulate(philly_at_half_load.jobs, gpus=8, discipline="backfill")
    assert f"{simulator.compute_metrics(results, 8).avg_jct_s / HOUR_S:.2f}" == "12.60"


# --- small traces, checked by hand ---------------------------------------------------------


def test_fifo_and_sjf_on_three_jobs(tmp_path):
    # a holds both GPUs 0-100; b (50 s) and c (10 s) both need both GPUs.
    path = history(tmp_path, [("a", "u", 0, 2, 100), ("b", "u", 1, 2, 50), ("c", "u", 2, 2, 10)])
    assert jcts(run(path, 2, "fifo")) == {"a": 100, "b": 149, "c": 158}
    assert jcts(run(path, 2, "sjf")) == {"a": 100, "b": 159, "c": 108}
    assert jcts(run(path, 2, "backfill")) == {"a": 100, "b": 149, "c": 158}


def test_skip_ahead_lets_a_long_job_pass_but_backfill_does_not(tmp_path):
    # b needs both GPUs and is reserved both at t=100; c (200 s) would push it back to 202;
    # d (50 s) ends by 100, so backfill lets it go first as well.
    path = history(
        tmp_path,
        [("a", "u", 0, 1, 100), ("b", "u", 1, 2, 10), ("c", "u", 2, 1, 200), ("d", "u", 3, 1, 50)],
    )
    fifo = run(path, 2, "fifo")
    assert (fifo["c"].start_s, fifo["b"].start_s, fifo["d"].start_s) == (2, 202, 100)
    backfill = run(path, 2, "backfill")
    assert (backfill["d"].start_s, backfill["b"].start_s, backfill["c"].start_s) == (3, 100, 110)


def test_backfill_may_use_gpus_the_reserved_job_will_not_need(tmp_path):
    # 3 GPUs: a holds two until 100, b needs two and is promised them at 100; the third GPU
    # is spare then, so c (500 s) may start on it now (EASY's extra nodes).
    path = history(tmp_path, [("a", "u", 0, 2, 100), ("b", "u", 1, 2, 10), ("c", "u", 2, 1, 500)])
    result = run(path, 3, "backfill")
    assert (result["c"].start_s, result["b"].start_s) == (2, 100)


def test_completions_then_arrivals_then_one_pass_at_each_instant(tmp_path):
    # At t=10, a ends and b, c arrive: sjf sees both before choosing, so c (5 s) goes first.
    path = history(tmp_path, [("a", "u", 0, 1, 10), ("b", "u", 10, 1, 100), ("c", "u", 10, 1, 5)])
    result = run(path, 1, "sjf")
    assert (result["c"].start_s, result["b"].start_s) == (10, 15)


def test_fairshare_prefers_the_user_with_less_usage(tmp_path):
    # heavy used the GPU 0-1000; at t=1000 its job and light's arrive together.
    path = history(
        tmp_path,
        [("h0", "heavy", 0, 1, 1000), ("h1", "heavy", 500, 1, 10), ("l1", "light", 600, 1, 10)],
    )
    assert run(path, 1, "fifo")["h1"].start_s == 1000
    fair = run(path, 1, "fairshare")
    assert (fair["l1"].start_s, fair["h1"].start_s) == (1000, 1010)


def test_memory_sharing_jobs_share_a_gpu(tmp_path):
    gib = 2**30
    path = history(
        tmp_path,
        [
            ("a", "u", 0, 1, 100, 30 * gib),
            ("b", "u", 0, 1, 100, 30 * gib),
            ("c", "u", 0, 1, 100, 30 * gib),
        ],
    )
    result = run(path, 1, "fifo")
    assert [result[j].start_s for j in "abc"] == [0, 0, 100]
    # Two jobs on one card keep it busy once, not twice: utilization is 100 %, not 150 %.
    assert simulator.compute_metrics(list(result.values()), 1).gpu_utilization == 1.0


@pytest.mark.parametrize(
    "policy", ["pack", "spread", "round-robin", "weighted-round-robin", "order"]
)
def test_whole_gpu_jobs_give_the_same_times_under_every_policy(tmp_path, policy):
    rows = [(str(n), "u", n * 7 % 50, 1 + n % 3, 30 + n * 11 % 90) for n in range(30)]
    path = history(tmp_path, rows)
    assert jcts(run(path, 4, "fifo", policy)) == jcts(run(path, 4, "fifo", "pack"))


def test_a_custom_policy_is_what_places_the_jobs(tmp_path):
    def only_gpu_0(request, loads, ctx):  # vetoes every other GPU
        return [load for load in loads if load.gpu.index == 0]

    path = history(tmp_path, [("a", "u", 0, 1, 100), ("b", "u", 0, 1, 100)])
    jobs = traces.load_trace(path).jobs
    results = simulator.simulate(jobs, gpus=2, policy="gpu0", custom_policies={"gpu0": only_gpu_0})
    assert [(r.start_s, r.gpu_indices) for r in results] == [(0, (0,)), (100, (0,))]


def test_the_documented_custom_policy_example_runs(tmp_path):
    doc = (REPO / "docs" / "scheduling.md").read_text()
    code = doc.split("# mypolicies/cool.py\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(code, "docs/scheduling.md", "exec"), namespace)
    path = history(tmp_path, [("a", "u", 0, 1, 100), ("b", "u", 0, 2, 100)])
    results = simulator.simulate(
        traces.load_trace(path).jobs,
        gpus=3,
        policy="coolest",
        custom_policies={"coolest": namespace["coolest"]},
    )
    assert [r.gpu_indices for r in results] == [(0,), (1, 2)]


# --- metrics ------------------------------------------------------------------------------


def test_metric_formulas_on_a_tiny_input():
    results = [
        JobResult("a", "t1", 1, 1.0, 0.0, 0.0, 1.0),  # bounded slowdown: max(1, 1/10) = 1
        JobResult("b", "t2", 2, 100.0, 0.0, 200.0, 300.0),
    ]  # 300/100 = 3
    m = simulator.compute_metrics(results, 4)
    assert (m.avg_jct_s, m.median_jct_s, m.p99_jct_s, m.avg_wait_s) == (150.5, 150.5, 300.0, 100.0)
    assert m.avg_bounded_slowdown == 2.0
    assert m.makespan_s == 300.0
    assert m.gpu_utilization == pytest.approx((1 * 1 + 2 * 100) / (4 * 300))
    assert m.jain_fairness == pytest.approx((1 + 3) ** 2 / (2 * (1 + 9)))
    assert m.tenants == 2


def test_busy_time_counts_a_shared_gpu_once():
    results = [
        JobResult("a", "t", 1, 100.0, 0.0, 0.0, 100.0, (0,)),
        JobResult("b", "t", 1, 100.0, 0.0, 50.0, 150.0, (0,)),
        JobResult("c", "t", 2, 10.0, 0.0, 0.0, 10.0, (0, 1)),
    ]
    assert simulator.busy_gpu_s(results) == 150 + 10
    # Without GPU indices (a hand-made result), a job counts its GPUs for its duration.
    assert simulator.busy_gpu_s([replace(r, gpu_indices=()) for r in results]) == 220


def test_percentile_is_nearest_rank_and_jain_index_bounds():
    assert simulator.percentile(list(range(1, 101)), 99) == 99
    assert simulator.percentile([5.0], 99) == 5.0
    assert simulator.jain_index([2.0, 2.0, 2.0]) == pytest.approx(1.0)
    assert simulator.jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)


# --- arrivals and load scaling --------------------------------------------------------------


def synthetic(tmp_path: Path, n: int = 200) -> Path:
    return history(
        tmp_path, [(str(k), f"u{k % 3}", k * 600, 1 + k % 4, 60 + k * 37 % 3000) for k in range(n)]
    )


def test_poisson_arrivals_are_deterministic_for_a_seed_and_keep_the_mean_rate(tmp_path):
    path = synthetic(tmp_path)
    one = traces.prepare(path, gpus=4, load=0.7, arrivals="poisson", seed=7)
    again = traces.prepare(path, gpus=4, load=0.7, arrivals="poisson", seed=7)
    other = traces.prepare(path, gpus=4, load=0.7, arrivals="poisson", seed=8)
    assert one == again and one.jobs != other.jobs
    assert [j.job_id for j in one.jobs] == [str(k) for k in range(200)]  # same jobs, same order
    mean_gap_s = one.jobs[-1].submit_s / len(one.jobs)
    assert mean_gap_s == pytest.approx(one.window_s / len(one.jobs), rel=0.25)
    a = simulator.simulate(one.jobs, gpus=4, discipline="fairshare")
    assert a == simulator.simulate(again.jobs, gpus=4, discipline="fairshare")


def test_load_scaling_follows_the_readme_formula(tmp_path):
    path = synthetic(tmp_path, 10)
    plain = traces.load_trace(path)
    scaled = traces.scale_to_load(plain, 0.25, 2)
    work_s = sum(j.num_gpus * j.duration_s for j in plain.jobs)
    assert scaled.arrival_scale == pytest.approx(work_s / (0.25 * 2 * 86400))
    assert [j.submit_s for j in scaled.jobs] == pytest.approx(
        [j.submit_s * scaled.arrival_scale for j in plain.jobs]
    )


def test_history_times_start_at_the_first_submission(tmp_path):
    path = history(tmp_path, [("b", "u", 1_700_000_100, 1, 60), ("a", "u", 1_700_000_000, 1, 60)])
    jobs = traces.load_trace(path).jobs
    assert [(j.job_id, j.submit_s) for j in jobs] == [("a", 0.0), ("b", 100.0)]


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, fragment",
    [
        (
            "job_id,user,submit_s,num_gpus,duration_s\n1,u,0,two,60\n",
            "line 2, column num_gpus: 'two' is not a whole number",
        ),
        (
            "job_id,user,submit_s,num_gpus,duration_s\n1,u,0,1,60\n2,u,5,1,-3\n",
            "line 3, column duration_s: '-3' must be at least 0",
        ),
        (
            "job_id,user,submit_s,num_gpus,duration_s\n1,u,0,-1,60\n",
            "column num_gpus: '-1' must be at least 0",
        ),
        (
            "job_id,user,submit_s,num_gpus,duration_s\n1,u,0,1\n",
            "line 2: 4 columns where the header has 5",
        ),
        ("job_id,user,submit_s,num_gpus,duration_s\n1,u,0,1,6\n1,u,0,1,6\n", "job 1 appears twice"),
        ("id,who,when\n1,u,0\n", "line 1: unknown trace header (id, who, when)"),
        ("job_id,user,submit_s,num_gpus,duration_s\n", "has no jobs"),
        ("", "is empty"),
    ],
)
def test_bad_trace_files_name_the_place(tmp_path, text, fragment):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(GpuschedError) as info:
        traces.load_trace(path)
    assert fragment in info.value.message and str(path) in info.value.message
    assert "\n" not in info.value.message


def test_bad_choices_list_the_valid_ones(tmp_path):
    path = synthetic(tmp_path, 3)
    jobs = traces.load_trace(path).jobs
    with pytest.raises(UsageError, match="Choose one of: fifo, backfill, fairshare, sjf"):
        simulator.simulate(jobs, gpus=4, discipline="lifo")
    with pytest.raises(UsageError, match="Choose one of: pack, spread, round-robin"):
        simulator.simulate(jobs, gpus=4, policy="densest")
    with pytest.raises(UsageError, match="asks for 3 GPUs; the simulated box has 2"):
        simulator.simulate(jobs, gpus=2)
    with pytest.raises(GpuschedError, match="not in submission order"):
        simulator.simulate(jobs[::-1], gpus=4)
    whole_card = history(tmp_path, [("a", "u", 0, 1, 60, 80 * 2**30)], "whole.csv")
    with pytest.raises(GpuschedError, match="job a asks for 85899345920 bytes per GPU"):
        simulator.simulate(traces.load_trace(whole_card).jobs, gpus=1)
    with pytest.raises(UsageError, match="Choose one of: trace, poisson"):
        traces.prepare(path, gpus=4, load=None, arrivals="bursty", seed=0)
    with pytest.raises(UsageError, match="must be above 0"):
        traces.prepare(path, gpus=4, load=0, arrivals="trace", seed=0)


def test_a_missing_trace_is_a_one_line_error(tmp_path):
    with pytest.raises(GpuschedError, match=r"cannot read trace .*nope\.csv"):
        traces.load_trace(tmp_path / "nope.csv")


# --- the command line ---------------------------------------------------------------------


def gpusched(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "gpusched", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.e2e
def test_simulate_cli_prints_stable_json(tmp_path):
    path = history(tmp_path, [("a", "u", 0, 2, 100), ("b", "v", 1, 2, 50), ("c", "u", 2, 2, 10)])
    proc = gpusched("simulate", str(path), "--gpus", "2", "--discipline", "sjf", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert {
        "trace",
        "jobs",
        "tenants",
        "gpus",
        "policy",
        "discipline",
        "load",
        "arrivals",
        "seed",
        "arrival_scale",
        "avg_jct_s",
        "median_jct_s",
        "p99_jct_s",
        "avg_wait_s",
        "avg_bounded_slowdown",
        "makespan_s",
        "gpu_utilization",
        "jain_fairness",
        "elapsed_s",
        "cpus",
        "mem",
        "config",
    } == set(report)
    assert report["avg_jct_s"] == pytest.approx((100 + 159 + 108) / 3)
    assert (report["jobs"], report["tenants"], report["makespan_s"]) == (3, 2, 160)


@pytest.mark.e2e
def test_simulate_cli_prints_a_table_in_hours(tmp_path):
    path = synthetic(tmp_path, 20)
    table = gpusched(
        "simulate",
        str(path),
        "--gpus",
        "4",
        "--load",
        "0.9",
        "--arrivals",
        "poisson",
        "--seed",
        "3",
    )
    assert table.returncode == 0, table.stderr
    assert "average JCT" in table.stdout and "seed 3" in table.stdout and " h\n" in table.stdout


@pytest.mark.parametrize(
    "args, status, fragment",
    [
        (
            ["--discipline", "lifo"],
            2,
            "Error: unknown discipline 'lifo'. Choose one of: fifo, backfill",
        ),
        (
            ["--policy", "densest"],
            2,
            "Error: unknown policy 'densest'. Choose one of: pack, spread",
        ),
        (
            ["--arrivals", "bursty"],
            2,
            "Error: unknown arrivals 'bursty'. Choose one of: trace, poisson",
        ),
        (["--gpus", "0"], 2, "Error: --gpus 0: the simulated box needs at least 1 GPU."),
    ],
)
def test_simulate_cli_bad_choices_exit_2_in_one_line(tmp_path, capsys, args, status, fragment):
    from gpusched.cli.app import main  # in-process: the subprocess test above covers the wiring

    assert main(["simulate", str(synthetic(tmp_path, 3)), *args]) == status
    err = capsys.readouterr().err
    assert err.startswith(fragment) and err.count("\n") == 1


def test_simulate_cli_missing_trace_exits_1(tmp_path, capsys):
    from gpusched.cli.app import main

    assert main(["simulate", str(tmp_path / "none.csv")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: cannot read trace") and err.count("\n") == 1


def test_math_is_finite_for_a_single_instant_trace(tmp_path):
    path = history(tmp_path, [("a", "u", 0, 1, 0)])
    m = simulator.compute_metrics(simulator.simulate(traces.load_trace(path).jobs, gpus=1), 1)
    assert all(math.isfinite(v) for v in (m.avg_jct_s, m.gpu_utilization, m.jain_fairness))


def test_cpus_and_memory_are_scheduled_when_the_trace_has_them(tmp_path):
    # Two CPU-only jobs of 3 cores on a 4-core host cannot overlap; a 1-core one can.
    trace = tmp_path / "host.csv"
    trace.write_text(
        "job_id,user,submit_s,num_gpus,duration_s,cpus,mem_bytes\n"
        "a,u,0,0,100,3,\nb,u,0,0,100,3,\nc,u,0,0,100,1,\n"
        f"d,u,0,1,100,1,{8 * 2**30}\ne,u,0,1,100,1,{8 * 2**30}\n"
    )
    jobs = traces.prepare(trace, gpus=2, load=None, arrivals="trace", seed=0).jobs
    host = HostCapacity(cpus=4, mem_bytes=12 * 2**30)
    start = {r.job_id: r.start_s for r in simulate(jobs, gpus=2, host=host)}
    assert start == {"a": 0.0, "c": 0.0, "b": 100.0, "d": 100.0, "e": 200.0}
    # Without a host, only GPUs count, and two GPUs hold every job at once.
    assert {r.start_s for r in simulate(jobs, gpus=2)} == {0.0}


@pytest.mark.e2e
def test_simulate_cli_counts_host_resources(tmp_path):
    trace = tmp_path / "host.csv"
    trace.write_text(
        "job_id,user,submit_s,num_gpus,duration_s,cpus\na,u,0,0,3600,2\nb,u,0,0,3600,2\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpusched",
            "simulate",
            str(trace),
            "--gpus",
            "1",
            "--cpus",
            "2",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(proc.stdout)
    assert report["makespan_s"] == pytest.approx(7200.0) and report["cpus"] == 2


def test_simulate_starts_from_the_daemons_defaults_and_names_every_discipline(capsys):
    from gpusched.cli.app import main
    from gpusched.core.config import Settings
    from gpusched.core.sched.queuerules import DISCIPLINES

    assert main(["simulate", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"Placement policy. [default: {Settings().policy}]" in text
    names = f"{', '.join(DISCIPLINES[:-1])} or {DISCIPLINES[-1]}."
    assert f"{names} [default: {Settings().discipline}]" in text


def test_a_begin_s_column_holds_jobs_until_then_as_the_daemon_does(tmp_path):
    # 2 GPUs, idle: a waits for its begin time (epoch seconds, as submit_s), b starts at
    # once, c's begin time has passed at its submit, and d (both GPUs) waits behind a.
    path = tmp_path / "begins.csv"
    path.write_text(
        "job_id,user,submit_s,num_gpus,duration_s,begin_s\n"
        "a,u,1700000000,1,50,1700000100\n"
        "b,u,1700000010,1,30,\n"
        "c,u,1700000020,1,10,1700000000\n"
        "d,u,1700000030,2,5,1700000040\n"
    )
    trace = traces.load_trace(path)
    assert [j.begin_s for j in trace.jobs] == [100.0, None, 0.0, 40.0]
    starts = {r.job_id: r.start_s for r in simulate(trace.jobs, gpus=2, discipline="fifo")}
    assert starts == {"a": 100.0, "b": 10.0, "c": 20.0, "d": 40.0}
    # Scaled arrivals keep a begin time as far after its submit, in scaled time.
    scaled = traces.scale_to_load(trace, 0.5, 2)
    assert scaled.jobs[0].begin_s == pytest.approx(100.0 * scaled.arrival_scale)
