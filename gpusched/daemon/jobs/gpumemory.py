"""GPU memory that learns, on the daemon's side: CUDA out-of-memory ends and their retries
with more (core/sched/gpuoom.py), and --gpu-mem auto from the store's history (core/sched/memestimate.py)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpusched.core.config import Settings
from gpusched.core.models import Inventory, Job, JobState, Request
from gpusched.core.sched import gpuoom, memestimate
from gpusched.core.sched.rightsize import Sizing, asked_bytes, gpu_mem_totals
from gpusched.core.units import size_human
from gpusched.daemon.requests.batches import TURN_BUDGET_S, Batched
from gpusched.proc import privileges
from gpusched.store.database import Store

if TYPE_CHECKING:
    from gpusched.daemon.state import DaemonState, Setup
    from gpusched.proc.runfile import ExitRecord

# The runs an estimate learns from, and those `gpusched history` lists.
ESTIMATE_STATES = ("succeeded",)
HISTORY_STATES = ("succeeded", "failed", "timeout", "oom", "gpu_oom", "cancelled")


def log_tail(job: Job, size_bytes: int = gpuoom.TAIL_BYTES) -> bytes:
    """The last size_bytes of the job's stderr log (its stdout too, when that is another
    file): where frameworks print an out-of-memory traceback. b"" if unreadable."""
    return b"".join(
        _file_tail(path, size_bytes, job.uid)
        for path in dict.fromkeys(p for p in (job.stderr_path, job.stdout_path) if p)
    )


def _file_tail(path: str, size_bytes: int, uid: int) -> bytes:
    # The daemon may be root and the log a user's (its --output file, anywhere): only a
    # regular file of the job's user, never through a link, never a FIFO put in its place.
    fd = privileges.open_owned(path, os.O_RDONLY, uid)
    if fd is None:
        return b""
    try:
        info = os.fstat(fd)
        return os.pread(fd, size_bytes, max(0, info.st_size - size_bytes))
    except OSError:
        return b""
    finally:
        os.close(fd)


def gpu_oom_end(
    job: Job, state: JobState, exit_code: int | None, signum: int | None, error: str
) -> str:
    """Why a GPU job's failed run died of CUDA out of memory, from its log; "" if not."""
    if state is not JobState.FAILED or job.request.gpus == 0 or job.requeueing:
        return ""
    return gpuoom.is_oom_end(exit_code, signum, error, log_tail(job))


def retry_with_more(job: Job, inventory: Inventory, headroom_bytes: int) -> tuple[Job, str]:
    """A run that ended gpu_oom: (the job its retry queues, "") with --gpu-mem raised by
    its growth, up to whole GPUs once that is as much as the largest GPU can give; or
    (the job unchanged, why a retry is no use) when it already had whole GPUs."""
    request, before = job.request, job.request.gpu_mem_bytes
    can_grow, grown = gpuoom.grown_bytes(
        before, job.mem_growth, gpuoom.usable_bytes(request, inventory, headroom_bytes)
    )
    if not can_grow:
        return job, "not retried: it already had whole GPUs"
    after = f"{size_human(grown)}" if grown else "a whole GPU (the largest GPU's memory)"
    reason = (
        f"raised from {size_human(before)} to {after} (x{job.mem_growth:g}) after "
        f"attempt {job.attempt} ran out of GPU memory"
    )
    return replace(job, request=replace(request, gpu_mem_bytes=grown), gpu_mem_reason=reason), ""


def raised_to_peak(job: Job, inventory: Inventory, headroom_bytes: int) -> Job:
    """A run that used more than its --gpu-mem, as its next run queues: --gpu-mem raised
    to the run's peak times its growth (retry_with_more's rule), up to a whole GPU once
    that is as much as the largest GPU can give."""
    request, peak = job.request, job.gpu_mem_peak_bytes or 0
    _, grown = gpuoom.grown_bytes(
        peak, job.mem_growth, gpuoom.usable_bytes(request, inventory, headroom_bytes)
    )
    after = size_human(grown) if grown else "a whole GPU (the largest GPU's memory)"
    reason = (
        f"raised from {size_human(request.gpu_mem_bytes)} to {after} (peak {size_human(peak)} "
        f"x{job.mem_growth:g}) after attempt {job.attempt} went over ({job.gpu_mem_over_by})"
    )
    return replace(job, request=replace(request, gpu_mem_bytes=grown), gpu_mem_reason=reason)


def estimate_request(
    store: Store, settings: Settings, uid: int, key: str, request: Request, inventory: Inventory
) -> tuple[Request, str]:
    """--gpu-mem auto: the request with the estimate for this user's job key, and why."""
    rows = store.gpu_peaks(uid, key, ESTIMATE_STATES, settings.estimate_runs)
    peaks = [row["gpu_mem_peak_bytes"] for row in rows if row["gpu_mem_peak_bytes"]]
    mem, why = memestimate.estimate(
        peaks,
        settings.estimate_margin_pct,
        gpuoom.usable_bytes(request, inventory, settings.mem_headroom_bytes),
    )
    return replace(request, gpu_mem_bytes=mem), why


HISTORY_RUNS = 20  # `gpusched history` without --last
WINDOW_ROWS = 2000  # rows one look for runs by their program reads (as daemon/observe/usage.py)
_RUN_FIELDS = (
    "id",
    "state",
    "started_at",
    "ended_at",
    "attempt",
    "gpu_mem_bytes",
    "gpu_mem_peak_bytes",
)


def history_request(
    state: DaemonState, setup: Setup, args: dict[str, Any], uid: int
) -> HistoryReport:
    """`gpusched history NAME` (the request's args; uid: the caller's): the caller's newest
    finished runs of a job, newest first, and what --gpu-mem auto would ask for now (for
    one GPU)."""
    count = min(args.get("last") or HISTORY_RUNS, 10_000)
    return HistoryReport(state, setup, uid, args["key"], count)


class HistoryReport(Batched):
    """The runs of NAME: those filed under it (its --name, or its command: the jobs_key
    index, at once), and those without a --name whose program is NAME, as `ls` names
    them, found walking down the ids a window at a time, for about TURN_BUDGET_S a turn
    (a name no run has reads every id), and only above the oldest of the first ones
    that would be listed."""

    def __init__(self, state: Any, setup: Any, uid: int, key: str, count: int):
        self.store, self.settings, self.inventory = state.store, setup.settings, state.inventory
        self.uid, self.key, self.count = uid, key, count
        self.runs = [
            {**dict(row), "job_key": key}
            for row in self.store.gpu_peaks(uid, key, HISTORY_STATES, count)
        ]
        self._floor = self.runs[-1]["id"] if len(self.runs) == count else 0
        self._top, self._found = 2**63 - 1, 0

    def step(self) -> dict[str, Any] | None:
        deadline = time.monotonic() + TURN_BUDGET_S  # real time: a turn's length
        while self._top > self._floor and self._found < self.count:
            rows, self._top = self.store.runs_by_program(
                self.uid, self.key, HISTORY_STATES, self._top, WINDOW_ROWS
            )
            self.runs += [dict(row) for row in rows]
            self._found += len(rows)
            if time.monotonic() >= deadline:
                return None
        runs = sorted(self.runs, key=lambda run: -run["id"])[: self.count]
        # Runs of one name may be filed under several keys (`python train.py --lr 0.1`,
        # `--lr 1`): the estimate is the one that submitting the newest again would get.
        job_key = runs[0]["job_key"] if runs else self.key
        request, why = estimate_request(
            self.store, self.settings, self.uid, job_key, Request(gpus=1), self.inventory
        )
        totals, sizing = gpu_mem_totals(self.inventory), Sizing()
        listed = []
        for run in runs:
            # What it asked for per GPU: its --gpu-mem, or the memory of its whole GPUs.
            asked = asked_bytes(run["gpu_mem_bytes"], json.loads(run["gpu_uuids"] or "[]"), totals)
            sizing.add(asked, run["gpu_mem_peak_bytes"])
            listed.append({**{f: run[f] for f in _RUN_FIELDS}, "gpu_mem_asked_bytes": asked})
        return {
            "key": self.key,
            "runs": listed,
            "estimate": {"gpu_mem_bytes": request.gpu_mem_bytes, "reason": why, "key": job_key},
            "right_sizing": sizing.to_dict(),
        }


def settle_end(
    job: Job,
    state: JobState,
    reason: str,
    record: ExitRecord,
    inventory: Inventory,
    headroom_bytes: int,
) -> tuple[Job, JobState, str, bool]:
    """A run's end as JobControl stores it: (job, state, end reason, whether it may be
    retried). A failed GPU run whose log shows CUDA out of memory ends gpu_oom; if it
    is retried on that, its next attempt gets more memory (retry_with_more). A run that
    used more than its --gpu-mem (daemon/jobs/gpuover.py) and goes back to the queue,
    requeued or retried, gets its peak times its growth (raised_to_peak)."""
    if job.gpu_mem_over_by and job.requeueing and not job.cancel_requested:
        return raised_to_peak(job, inventory, headroom_bytes), state, reason, True
    if job.gpu_mem_stop and state is JobState.GPU_OOM:
        if "gpu_oom" in job.retry_on and job.attempt - job.restarts <= job.retries:
            job = raised_to_peak(job, inventory, headroom_bytes)
        return job, state, reason, True
    cause = gpu_oom_end(job, state, record.exit_code, record.signal, record.error)
    if not cause:
        return job, state, reason, True
    if "gpu_oom" not in job.retry_on or job.attempt - job.restarts > job.retries:
        return job, JobState.GPU_OOM, cause, True
    grown, refused = retry_with_more(job, inventory, headroom_bytes)
    return grown, JobState.GPU_OOM, f"{cause}; {refused}" if refused else cause, not refused
