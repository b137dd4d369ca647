"""GPU memory that learns, on the daemon's side: CUDA out-of-memory ends and their retries
with more (core/gpuoom.py), and --gpu-mem auto from the store's history (core/memestimate.py)."""

from __future__ import annotations

import os
from dataclasses import replace

from gpusched.core import gpuoom, memestimate
from gpusched.core.config import Settings
from gpusched.core.models import Inventory, Job, JobState, Request
from gpusched.core.units import size_human
from gpusched.daemon.store import Store
from gpusched.proc import privileges

# The runs an estimate learns from, and those `gpusched history` lists.
ESTIMATE_STATES = ("succeeded",)
HISTORY_STATES = ("succeeded", "failed", "timeout", "oom", "gpu_oom", "cancelled")


def log_tail(job: Job, size_bytes: int = gpuoom.TAIL_BYTES) -> bytes:
    """The last size_bytes of the job's stderr log (its stdout too, when that is another
    file): where frameworks print an out-of-memory traceback. b"" if unreadable."""
    return b"".join(_file_tail(path, size_bytes, job.uid) for path in
                    dict.fromkeys(p for p in (job.stderr_path, job.stdout_path) if p))


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


def gpu_oom_end(job: Job, state: JobState, exit_code: int | None, signum: int | None,
                error: str) -> str:
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
        before, job.mem_growth, gpuoom.usable_bytes(request, inventory, headroom_bytes))
    if not can_grow:
        return job, "not retried: it already had whole GPUs"
    after = f"{size_human(grown)}" if grown else "a whole GPU (the largest GPU's memory)"
    reason = (f"raised from {size_human(before)} to {after} (x{job.mem_growth:g}) after "
              f"attempt {job.attempt} ran out of GPU memory")
    return replace(job, request=replace(request, gpu_mem_bytes=grown),
                   gpu_mem_reason=reason), ""


def estimate_request(store: Store, settings: Settings, uid: int, key: str,
                     request: Request, inventory: Inventory) -> tuple[Request, str]:
    """--gpu-mem auto: the request with the estimate for this user's job key, and why."""
    rows = store.gpu_peaks(uid, key, ESTIMATE_STATES, settings.estimate_runs)
    peaks = [row["gpu_mem_peak_bytes"] for row in rows if row["gpu_mem_peak_bytes"]]
    mem, why = memestimate.estimate(peaks, settings.estimate_margin_pct, gpuoom.usable_bytes(
        request, inventory, settings.mem_headroom_bytes))
    return replace(request, gpu_mem_bytes=mem), why


HISTORY_RUNS = 20  # `gpusched history` without --last


def history_request(state, setup, req) -> dict:
    """`gpusched history KEY`: the caller's newest finished runs of a job key, newest
    first, and what --gpu-mem auto would ask for now (for one GPU)."""
    uid, key = req.creds[1], req.args["key"]
    count = min(req.args.get("last") or HISTORY_RUNS, 10_000)
    runs = [dict(row) for row in state.store.gpu_peaks(uid, key, HISTORY_STATES, count)]
    request, why = estimate_request(state.store, setup.settings, uid, key, Request(gpus=1),
                                    state.inventory)
    return {"key": key, "runs": runs,
            "estimate": {"gpu_mem_bytes": request.gpu_mem_bytes, "reason": why}}


def settle_end(job: Job, state: JobState, reason: str, record, inventory: Inventory,
               headroom_bytes: int) -> tuple[Job, JobState, str, bool]:
    """A run's end as JobControl stores it: (job, state, end reason, whether it may be
    retried). A failed GPU run whose log shows CUDA out of memory ends gpu_oom; if it
    is retried on that, its next attempt gets more memory (retry_with_more)."""
    cause = gpu_oom_end(job, state, record.exit_code, record.signal, record.error)
    if not cause:
        return job, state, reason, True
    if "gpu_oom" not in job.retry_on or job.attempt - job.restarts > job.retries:
        return job, JobState.GPU_OOM, cause, True
    grown, refused = retry_with_more(job, inventory, headroom_bytes)
    return grown, JobState.GPU_OOM, f"{cause}; {refused}" if refused else cause, not refused
