"""Job traces for the simulator: the Philly CSV and a simple history CSV, load scaling, arrivals."""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from gpusched.core.errors import GpuschedError, UsageError

_Number = TypeVar("_Number", int, float)

DAY_S = 86400.0
PHILLY_COLUMNS = (
    "job_id",
    "tenant",
    "orig_timestamp",
    "submit_raw_s",
    "num_gpus",
    "duration_s",
    "gpu_time_s",
)
HISTORY_COLUMNS = ("job_id", "user", "submit_s", "num_gpus", "duration_s")
HISTORY_OPTIONAL = ("gpu_mem_bytes", "gpu_mem_peak_bytes", "cpus", "mem_bytes", "begin_s")
ARRIVALS = ("trace", "poisson")


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace: who, when, how many GPUs and for how long (its true runtime)."""

    job_id: str
    tenant: str
    submit_s: float
    num_gpus: int
    duration_s: float
    gpu_time_s: float
    gpu_mem_bytes: int | None = None  # None: whole GPUs, exclusively (Philly)
    cpus: int = 1
    mem_bytes: int | None = None  # host memory; None: not declared
    begin_s: float | None = None  # --begin: not started before this (submit_s's clock)
    gpu_mem_peak_bytes: int | None = None  # the most it used on one GPU; None: not recorded


@dataclass(frozen=True)
class Trace:
    jobs: tuple[TraceJob, ...]
    # The span the submissions cover, in seconds: load scaling spreads the work over it.
    window_s: float
    source: str = ""
    arrival_scale: float = 1.0  # the S by which submit times were stretched
    origin_s: float = 0.0  # what the history trace's first submit time was, before it became 0


def _field(
    row: dict[str, str], column: str, where: str, kind: type[_Number], minimum: float
) -> _Number:
    text = (row.get(column) or "").strip()
    try:
        value = kind(text)
    except ValueError:
        noun = "a whole number" if kind is int else "a number"
        raise GpuschedError(
            f"{where}, column {column}: {text!r} is not {noun}. Fix the value in the file."
        ) from None
    if not math.isfinite(value) or value < minimum:
        raise GpuschedError(
            f"{where}, column {column}: {text!r} must be at least {minimum:g}. "
            "Fix the value in the file."
        )
    return value


def _philly_job(row: dict[str, str], where: str) -> TraceJob:
    gpus = _field(row, "num_gpus", where, int, 1)
    return TraceJob(
        job_id=row["job_id"].strip(),
        tenant=row["tenant"].strip(),
        submit_s=_field(row, "submit_raw_s", where, float, 0),
        num_gpus=gpus,
        duration_s=_field(row, "duration_s", where, float, 0),
        gpu_time_s=_field(row, "gpu_time_s", where, float, 0),
    )


def _optional(row: dict[str, str], column: str, where: str, minimum: int) -> int | None:
    return _field(row, column, where, int, minimum) if (row.get(column) or "").strip() else None


def _history_job(row: dict[str, str], where: str) -> TraceJob:
    # CPU-only jobs (num_gpus 0) compete for the host's cores and memory only.
    gpus = _field(row, "num_gpus", where, int, 0)
    duration_s = _field(row, "duration_s", where, float, 0)
    return TraceJob(
        job_id=row["job_id"].strip(),
        tenant=row["user"].strip(),
        submit_s=_field(row, "submit_s", where, float, 0),
        num_gpus=gpus,
        duration_s=duration_s,
        gpu_time_s=gpus * duration_s,
        gpu_mem_bytes=_optional(row, "gpu_mem_bytes", where, 1),
        gpu_mem_peak_bytes=_optional(row, "gpu_mem_peak_bytes", where, 1),
        cpus=_optional(row, "cpus", where, 1) or 1,
        mem_bytes=_optional(row, "mem_bytes", where, 1),
        begin_s=_field(row, "begin_s", where, float, 0)
        if (row.get("begin_s") or "").strip()
        else None,
    )


def _pick_format(
    header: list[str], path: Path
) -> tuple[Callable[[dict[str, str], str], TraceJob], list[str]]:
    names = [h.strip() for h in header]
    if all(c in names for c in PHILLY_COLUMNS):
        return _philly_job, names
    if all(c in names for c in HISTORY_COLUMNS):
        return _history_job, names
    raise GpuschedError(
        f"{path} line 1: unknown trace header ({', '.join(names) or 'empty'}). Use the Philly "
        f"columns ({', '.join(PHILLY_COLUMNS)}) or the history columns "
        f"({', '.join(HISTORY_COLUMNS)}, optionally {', '.join(HISTORY_OPTIONAL)}); "
        "docs/scheduling.md has both."
    )


def _window_s(jobs: list[TraceJob]) -> float:
    # A trace covers whole days from its origin (Philly's is 6-20 November, 14 days; its
    # last job arrives at 13.85 d): round the last submission up to a whole day.
    last_s = max(j.submit_s for j in jobs)
    return max(1.0, math.ceil(last_s / DAY_S)) * DAY_S


def load_trace(path: Path) -> Trace:
    """Read a trace CSV into jobs in submission order (ties keep file order)."""
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError) as exc:
        raise GpuschedError(
            f"cannot read trace {path}: {getattr(exc, 'strerror', None) or exc}. Check the path."
        ) from None
    if not rows:
        raise GpuschedError(f"{path} is empty. A trace needs a header line and one line per job.")
    parse, names = _pick_format(rows[0], path)
    jobs, seen = [], set()
    for number, cells in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in cells):
            continue
        where = f"{path} line {number}"
        if len(cells) != len(names):
            raise GpuschedError(
                f"{where}: {len(cells)} columns where the header has {len(names)}. Fix the line."
            )
        job = parse(dict(zip(names, cells)), where)
        if job.job_id in seen:
            raise GpuschedError(
                f"{where}, column job_id: job {job.job_id} appears twice. Give each job its own id."
            )
        seen.add(job.job_id)
        jobs.append(job)
    if not jobs:
        raise GpuschedError(f"{path} has no jobs, only a header.")
    first_s = min(j.submit_s for j in jobs)
    origin_s = first_s if parse is _history_job else 0.0
    if origin_s:  # history times may be epoch seconds: start at 0
        jobs = [_moved(j, -first_s, 1.0) for j in jobs]
    jobs.sort(key=lambda j: j.submit_s)  # stable: equal times keep the file's order
    return Trace(tuple(jobs), _window_s(jobs), str(path), origin_s=origin_s)


def _moved(job: TraceJob, shift_s: float, scale: float) -> TraceJob:
    """A job's submit (and begin) time shifted, then scaled: a begin time moves with
    its submit, so that it stays as far after it (in scaled time)."""
    begin_s = None if job.begin_s is None else (job.begin_s + shift_s) * scale
    return replace(job, submit_s=(job.submit_s + shift_s) * scale, begin_s=begin_s)


def scale_to_load(trace: Trace, load: float, gpus: int) -> Trace:
    """Stretch arrivals so the offered work is `load` of `gpus` GPUs over the window.

    S = sum(gpu_time_s) / (load * gpus * window_s), the trace README's formula.
    """
    if not load > 0:
        raise UsageError(f"--load {load} must be above 0 (0.5 means the GPUs are half busy).")
    scale = sum(j.gpu_time_s for j in trace.jobs) / (load * gpus * trace.window_s)
    jobs = tuple(_moved(j, 0.0, scale) for j in trace.jobs)
    return replace(
        trace, jobs=jobs, window_s=trace.window_s * scale, arrival_scale=trace.arrival_scale * scale
    )


def poisson_arrivals(trace: Trace, seed: int) -> Trace:
    """The same jobs in the same order, arriving as a Poisson process at the trace's mean rate."""
    rng = random.Random(seed)
    mean_gap_s = trace.window_s / len(trace.jobs)
    now_s, jobs = 0.0, []
    for job in trace.jobs:
        now_s += rng.expovariate(1.0 / mean_gap_s)
        jobs.append(_moved(job, now_s - job.submit_s, 1.0))
    return replace(trace, jobs=tuple(jobs))


def prepare(path: Path, *, gpus: int, load: float | None, arrivals: str, seed: int) -> Trace:
    """Load a trace, scale it to a load and reshape its arrivals, as `gpusched simulate` does."""
    if arrivals not in ARRIVALS:
        raise UsageError(f"unknown arrivals {arrivals!r}. Choose one of: {', '.join(ARRIVALS)}.")
    trace = load_trace(path)
    if load is not None:
        trace = scale_to_load(trace, load, gpus)
    return poisson_arrivals(trace, seed) if arrivals == "poisson" else trace
