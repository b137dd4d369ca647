"""`gpusched simulate --estimates`: the replay with --gpu-mem auto, its sharing and OOM counts."""

from __future__ import annotations

import json
from dataclasses import replace

from gpusched.core.sched.placement import PlacementRules
from gpusched.sim import estimates
from gpusched.sim.simulator import JobResult
from gpusched.sim.traces import TraceJob

GIB = 2**30


def _job(n: int, submit_s: float, duration_s: float = 100.0) -> TraceJob:
    return TraceJob(str(n), "t", submit_s, 1, duration_s, duration_s)


def test_an_estimate_reads_only_runs_that_had_ended_by_the_submission():
    jobs = [_job(0, 0), _job(1, 50), _job(2, 200)]
    model = [estimates.MemoryModel("k", 10 * GIB)] * 3
    out = estimates.with_estimates(jobs, model, PlacementRules())
    # Job 1 comes while job 0 still runs: no history, a whole GPU. Job 2 comes after
    # both ended: p95 of 10 GiB + 10%, rounded up to 256 MiB.
    assert [j.gpu_mem_bytes for j in out] == [None, None, 11 * GIB]


def test_the_report_counts_sharing_and_would_be_ooms():
    jobs = [
        replace(_job(n, 0), gpu_mem_bytes=mem) for n, mem in enumerate([8 * GIB, 8 * GIB, None])
    ]
    model = [estimates.MemoryModel("k", peak) for peak in (6 * GIB, 9 * GIB, 70 * GIB)]
    results = [
        JobResult("0", "t", 1, 10, 0, 0, 10, (0,)),
        JobResult("1", "t", 1, 10, 0, 5, 15, (0,)),  # beside job 0 from 5 to 10
        JobResult("2", "t", 1, 10, 0, 0, 10, (1,)),
    ]
    found = estimates.report(jobs, model, results)
    assert (found.estimated, found.whole_gpu, found.shared_gpu, found.would_oom) == (2, 1, 2, 1)


def test_simulate_estimates_from_the_command_line(home, tmp_path):
    trace = tmp_path / "trace.csv"
    rows = [f"{n},u{n % 2},{n * 600},1,{300 + n}" for n in range(40)]
    trace.write_text("job_id,user,submit_s,num_gpus,duration_s\n" + "\n".join(rows) + "\n")
    report = json.loads(
        home.run("simulate", str(trace), "--gpus", "2", "--estimates", "--json").stdout
    )["estimates"]
    assert report["jobs"] == 40 and report["estimated"] + report["whole_gpu"] == 40
    assert report["estimated"] > 0
    text = home.run("simulate", str(trace), "--gpus", "2", "--estimates").stdout
    assert "with --gpu-mem auto:" in text and "would have run out of GPU memory" in text
    plain = home.run("simulate", str(trace), "--gpus", "2", "--json").stdout
    assert "estimates" not in json.loads(plain)
