"""`simulate --estimates`: replay a trace with --gpu-mem auto, and count how many jobs would
have shared a GPU and how many would have run out of GPU memory.

Traces such as Philly's record no GPU memory, so each job is given a job key and a peak
from a seeded model: every tenant runs a few kinds of job (the key), each kind with its
own typical peak, and each run varies around it. A job's estimate reads the peaks of the
runs of its key that had ended, at the earliest, by its submission (its wait in the
original cluster is not known), through the daemon's own estimate (core/sched/memestimate.py).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpusched.core.sched import memestimate
from gpusched.core.sched.placement import PlacementRules
from gpusched.sim.simulator import GPU_MEM_BYTES, JobResult
from gpusched.sim.traces import TraceJob

GIB = 2**30
KINDS_PER_TENANT = 8  # kinds of job each tenant runs: the job keys
PEAK_SPREAD = 0.08  # how much one run's peak varies around its kind's (a fraction)


@dataclass(frozen=True)
class MemoryModel:
    """A job's key and its true GPU memory peak per GPU."""

    key: str
    peak_bytes: int


@dataclass(frozen=True)
class EstimateReport:
    jobs: int
    estimated: int  # jobs given less than a whole GPU
    whole_gpu: int  # no history yet, or an estimate as large as a GPU
    shared_gpu: int  # ran beside another job on one of its GPUs at some moment
    would_oom: int  # their true peak is above their estimate
    mem_asked_ratio: float  # memory asked for / whole GPUs' memory, over the jobs


def memory_model(trace_jobs: Sequence[TraceJob], seed: int = 0) -> list[MemoryModel]:
    """Each job's key and peak (the trace's gpu_mem_peak_bytes where it has one):
    deterministic in the seed and the job's own fields."""
    kind_peak: dict[str, float] = {}
    out = []
    for job in trace_jobs:
        kind = zlib.crc32(f"{job.tenant}:{job.num_gpus}:{job.job_id}".encode()) % KINDS_PER_TENANT
        key = f"{job.tenant}-{job.num_gpus}gpu-kind{kind}"
        rng = random.Random(f"{seed}:{key}")
        base = kind_peak.setdefault(key, rng.uniform(4, 70) * GIB)
        run = random.Random(f"{seed}:{job.job_id}").gauss(1.0, PEAK_SPREAD)
        modelled = int(min(GPU_MEM_BYTES * 0.98, base * max(0.5, run)))
        out.append(MemoryModel(key, job.gpu_mem_peak_bytes or modelled))  # the trace's, if any
    return out


def with_estimates(
    trace_jobs: Sequence[TraceJob],
    model: Sequence[MemoryModel],
    rules: PlacementRules,
    margin_pct: float = 10.0,
    runs: int = memestimate.HISTORY_RUNS,
) -> list[TraceJob]:
    """The trace with each job's --gpu-mem as --gpu-mem auto would set it."""
    usable = GPU_MEM_BYTES - rules.mem_headroom_bytes
    ended: dict[str, list[tuple[float, int]]] = {}  # key -> (earliest end, peak)
    out = []
    for job, mem in zip(trace_jobs, model):
        history = [peak for end_s, peak in ended.get(mem.key, ()) if end_s <= job.submit_s]
        estimate, _ = memestimate.estimate(history[-runs:], margin_pct, usable)
        out.append(replace(job, gpu_mem_bytes=estimate))
        ended.setdefault(mem.key, []).append((job.submit_s + job.duration_s, mem.peak_bytes))
    return out


def report(
    estimated: Sequence[TraceJob], model: Sequence[MemoryModel], results: Sequence[JobResult]
) -> EstimateReport:
    """What replaying with estimates did: sharing, and who would have hit OOM."""
    spans: dict[int, list[tuple[float, float, int]]] = {}
    for n, result in enumerate(results):
        for index in result.gpu_indices:
            spans.setdefault(index, []).append((result.start_s, result.end_s, n))
    shared: set[int] = set()
    for intervals in spans.values():
        intervals.sort()
        live: list[tuple[float, int]] = []  # (end, job) of the runs still on the GPU
        for start_s, end_s, n in intervals:
            live = [(e, m) for e, m in live if e > start_s]
            if live:
                shared.update([n, *(m for _, m in live)])
            live.append((end_s, n))
    asked = sum((j.gpu_mem_bytes or GPU_MEM_BYTES) * j.num_gpus for j in estimated)
    return EstimateReport(
        jobs=len(estimated),
        estimated=sum(1 for j in estimated if j.gpu_mem_bytes is not None),
        whole_gpu=sum(1 for j in estimated if j.gpu_mem_bytes is None),
        shared_gpu=len(shared),
        would_oom=sum(
            1
            for j, m in zip(estimated, model)
            if j.gpu_mem_bytes is not None and m.peak_bytes > j.gpu_mem_bytes
        ),
        mem_asked_ratio=asked / (GPU_MEM_BYTES * sum(j.num_gpus for j in estimated)),
    )
