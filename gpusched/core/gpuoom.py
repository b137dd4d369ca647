"""CUDA out-of-memory: how a run that died of it is recognised, and the --gpu-mem of its retry.

Pure and stdlib only: the daemon reads the log tail (daemon/gpuoomcheck.py), the job
writes REPORT_MARK through gpusched.job.report_oom().
"""

from __future__ import annotations

import math

from gpusched.core.models import Inventory, Request

# How much of the end of a job's log is searched: a traceback is a few KiB, and the read
# must stay cheap however large the log grew.
TAIL_BYTES = 64 * 1024
# What the frameworks print when the GPU runs out of memory, and whose words they are.
MESSAGES = (
    (b"torch.OutOfMemoryError", "torch"),
    (b"torch.cuda.OutOfMemoryError", "torch"),
    (b"CUDA out of memory", "torch"),
    (b"ResourceExhaustedError", "TensorFlow"),
    (b"OOM when allocating", "TensorFlow"),
    (b"RESOURCE_EXHAUSTED", "JAX"),
    (b"Out of memory while trying to allocate", "JAX"),
)
# The line gpusched.job.report_oom() writes to the job's stderr.
REPORT_MARK = b"[gpusched: the job reports CUDA out of memory]"
DEFAULT_GROWTH = 1.25
MAX_GROWTH = 16.0
# A raised --gpu-mem is rounded up to this: "25 GiB", not "25.0000003 GiB".
ROUND_BYTES = 256 * 2**20


def oom_cause(tail: bytes) -> str:
    """Why a log's tail says the run ran out of GPU memory ("" if it does not): the
    job's own report first, else the first framework message found."""
    if REPORT_MARK in tail:
        return "the job reported CUDA out of memory (gpusched.job.report_oom)"
    for message, framework in MESSAGES:
        if message in tail:
            return f"CUDA out of memory ({framework}: {message.decode()!r} in its log)"
    return ""


def is_oom_end(exit_code: int | None, signum: int | None, error: str, tail: bytes) -> str:
    """oom_cause of a run that did not succeed (a run that printed the message and then
    exited 0 recovered by itself); "" for any other."""
    if exit_code == 0 and not signum and not error:
        return ""
    return oom_cause(tail)


def round_up(size_bytes: float) -> int:
    return int(math.ceil(size_bytes / ROUND_BYTES) * ROUND_BYTES)


def grown_bytes(gpu_mem_bytes: int | None, growth: float, largest_gpu_bytes: int) -> int | None:
    """The --gpu-mem of the next attempt: this one's times growth, rounded up, at most the
    largest GPU's memory; None when it cannot grow (whole GPUs, or at the largest already)."""
    if gpu_mem_bytes is None or largest_gpu_bytes <= 0 or gpu_mem_bytes >= largest_gpu_bytes:
        return None
    return min(round_up(gpu_mem_bytes * growth), largest_gpu_bytes)


def largest_gpu_bytes(request: Request, inventory: Inventory) -> int:
    """The most memory per GPU the request could ever get here: the total of the
    request.gpus-th largest GPU its constraints allow (0: none known yet)."""
    allowed = sorted((g.mem_total_bytes for g in inventory.schedulable()
                      if request.constraints.allows(g)), reverse=True)
    return allowed[request.gpus - 1] if 0 < request.gpus <= len(allowed) else 0
