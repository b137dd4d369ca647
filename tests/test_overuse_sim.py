"""`simulate --estimates`: jobs that would die of a neighbour's GPU memory over-use, without
and with enforcement (sim/overuse.py), counted on placements made by hand."""

from __future__ import annotations

import json

from gpusched.sim import estimates, overuse
from gpusched.sim.simulator import JobResult
from gpusched.sim.traces import TraceJob

GIB = 2**30
H = 3600.0


def _ran(n: int, gpus: tuple[int, ...], start_s: float, end_s: float = 10 * H) -> JobResult:
    return JobResult(str(n), "t", len(gpus), end_s - start_s, 0.0, start_s, end_s, gpus)


def test_the_neighbour_within_its_promise_dies_unless_the_over_user_is_stopped():
    # job: (ask GiB per GPU, None: a whole GPU; peak GiB; where and when it ran). 80 GiB GPUs.
    jobs = [
        (10, 30, _ran(0, (0,), 0)),  # over its ask...
        (60, 55, _ran(1, (0,), H)),  # ...when this one starts: 85 GiB on GPU 0
        (20, 25, _ran(2, (1,), 0)),  # over its ask, but 65 GiB fit beside job 3
        (40, 40, _ran(3, (1,), 0)),
        (30, 50, _ran(4, (2,), 0)),  # two over-users: 85 GiB on GPU 2 at 2 h
        (30, 35, _ran(5, (2,), 2 * H)),
        (40, 40, _ran(6, (3, 4), 0)),  # on two GPUs...
        (30, 45, _ran(7, (4,), H)),  # ...an over-user joins it on GPU 4: 85 GiB
        (40, 40, _ran(8, (3,), 2 * H)),  # 80 GiB on GPU 3 beside job 6: fits exactly
        (None, 70, _ran(9, (5,), 0)),  # a whole GPU is never over its ask
    ]
    found = overuse.count(
        [None if ask is None else ask * GIB for ask, _, _ in jobs],
        [peak * GIB for _, peak, _ in jobs],
        [ran for _, _, ran in jobs],
    )
    # Over-users: jobs 0, 2, 4, 5, 7. Collisions: GPU 0 at 1 h, GPU 4 at 1 h, GPU 2 at 2 h.
    assert (found.over_users, found.collisions) == (5, 3)
    # Not enforced: job 1 dies as it starts (nothing lost), job 6 at 1 h (1 h on two GPUs:
    # 2 GPU-h), and on GPU 2, with no one within its promise, the newest over-user, job 5
    # (as it starts). Job 8 then has GPU 3 to itself.
    assert found.before == overuse.Outcome(within_promise=2, over_users=1, lost_gpu_hours=2.0)
    # Enforced: job 0 is stopped at 1 h (1 GPU-h lost), jobs 7 and 5 as they start; job 6
    # lives, and job 8 fits beside it (80 GiB is not past 80 GiB).
    assert found.after == overuse.Outcome(within_promise=0, over_users=3, lost_gpu_hours=1.0)


def test_with_enforcement_no_job_within_its_promise_dies():
    # One GPU, asks of 20 GiB each; jobs 0 and 2 are over theirs. Starts at 0, 1, 2, 3 h.
    asks = [20 * GIB] * 4
    peaks = [50 * GIB, 15 * GIB, 25 * GIB, 20 * GIB]
    results = [_ran(n, (0,), n * H) for n in range(4)]
    found = overuse.count(asks, peaks, results)
    # At 2 h: 50 + 15 + 25 = 90 GiB. Not enforced, job 1 dies (1 GPU-h lost); at 3 h
    # 50 + 25 + 20 = 95 GiB and job 3 dies as it starts.
    assert found.before == overuse.Outcome(within_promise=2, over_users=0, lost_gpu_hours=1.0)
    # Enforced, job 2 is stopped as it starts; at 3 h 50 + 15 + 20 = 85 GiB and job 0, the
    # one over-user left, is stopped after 3 h.
    assert found.after == overuse.Outcome(within_promise=0, over_users=2, lost_gpu_hours=3.0)


# Bob's runs of one kind of job (the seeded model of sim/estimates.py gives all five the key
# bob-1gpu-kind0, base peak 40.5 GiB): three runs one after another teach --gpu-mem auto
# 38 GiB; then j383 (peak 36.1 GiB, within) and j189 (peak 47.5 GiB, over) share the GPU.
TINY = """\
job_id,user,submit_s,num_gpus,duration_s
j299,bob,0,1,100
j95,bob,200,1,100
j250,bob,400,1,100
j383,bob,1000,1,500
j189,bob,1001,1,500
"""


def test_simulate_estimates_counts_over_use_from_the_command_line(home, tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text(TINY)
    args = ("simulate", str(trace), "--gpus", "1", "--estimates")
    found = json.loads(home.run(*args, "--json").stdout)["estimates"]["overuse"]
    # 36.1 + 47.5 GiB is past 80 GiB: j383 dies 1 s into its run, unless j189 is stopped.
    assert (found["over_users"], found["collisions"]) == (1, 1)
    assert found["before"] == {"within_promise": 1, "over_users": 0, "lost_gpu_hours": 1 / 3600}
    assert found["after"] == {"within_promise": 0, "over_users": 1, "lost_gpu_hours": 0.0}
    text = home.run(*args).stdout
    assert "over-use: 1 jobs above their --gpu-mem; 1 starts took a GPU past its memory" in text
    assert "not enforced: 1 died within their promise, 0 over it; 0.0 GPU-h lost" in text
    assert "enforced:     0 died within their promise, 1 over it stopped" in text


def test_a_trace_with_asks_and_peaks_counts_over_use_without_estimates(home, tmp_path):
    trace = tmp_path / "trace.csv"
    gib = {n: str(n * GIB) for n in (5, 10, 30, 55, 60)}
    trace.write_text(
        "job_id,user,submit_s,num_gpus,duration_s,gpu_mem_bytes,gpu_mem_peak_bytes\n"
        f"a,alice,0,1,7200,{gib[10]},{gib[30]}\n"  # asked for 10 GiB, used 30
        f"b,bob,3600,1,3600,{gib[60]},{gib[55]}\n"
        f"c,carol,3600,1,3600,{gib[5]},\n"  # no peak recorded: taken as its ask
    )
    args = ("simulate", str(trace), "--gpus", "1")
    found = json.loads(home.run(*args, "--json").stdout)["overuse"]
    # All three fit by their asks (75 GiB) and start by 1 h. b's start makes 30 + 55 GiB:
    # b dies as it starts, or a is stopped after its first hour; c (5 GiB) fits either way.
    assert (found["over_users"], found["collisions"]) == (1, 1)
    assert found["before"] == {"within_promise": 1, "over_users": 0, "lost_gpu_hours": 0.0}
    assert found["after"] == {"within_promise": 0, "over_users": 1, "lost_gpu_hours": 1.0}
    text = home.run(*args).stdout
    assert "enforced:     0 died within their promise, 1 over it stopped; 1.0 GPU-h" in text
    trace.write_text(trace.read_text().replace(f",{gib[30]}\n", ",\n").replace(f",{gib[55]}", ","))
    assert "overuse" not in json.loads(home.run(*args, "--json").stdout)  # no peaks: no count


def test_estimates_learn_from_a_traces_own_peaks():
    jobs = [
        TraceJob("a", "t", 0, 1, 60, 60, gpu_mem_peak_bytes=7 * GIB),
        TraceJob("b", "t", 0, 1, 60, 60),
    ]
    peaks = [m.peak_bytes for m in estimates.memory_model(jobs)]
    assert peaks[0] == 7 * GIB and peaks[1] != 7 * GIB  # b's from the seeded model
