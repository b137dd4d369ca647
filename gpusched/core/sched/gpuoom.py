"""CUDA out-of-memory: how a run that died of it is recognised, and the --gpu-mem of its retry.

Pure and stdlib only: the daemon reads the log tail (daemon/jobs/gpumemory.py), the job
writes REPORT_MARK through gpusched.job.report_oom().
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

# The job imports this module (gpusched.job.report_oom): models only for type checkers.
if TYPE_CHECKING:
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


def grown_bytes(
    gpu_mem_bytes: int | None, growth: float, usable_bytes: int
) -> tuple[bool, int | None]:
    """(whether it can grow, the --gpu-mem of the next attempt): this one's times growth,
    rounded up; None, a whole GPU, once that is as much as the largest GPU can give
    (usable_bytes: its memory less the headroom). A job on whole GPUs cannot grow."""
    if gpu_mem_bytes is None:
        return False, None
    grown = round_up(gpu_mem_bytes * growth)
    return True, (None if usable_bytes and grown >= usable_bytes else grown)


def usable_bytes(request: Request, inventory: Inventory, headroom_bytes: int) -> int:
    """The most memory per GPU a sharing job could ever be given here: the
    request.gpus-th largest GPU its constraints allow, less the headroom kept free on a
    shared GPU ([gpus] mem_headroom). 0: no GPU known yet."""
    allowed = sorted(
        (g.mem_total_bytes for g in inventory.schedulable() if request.constraints.allows(g)),
        reverse=True,
    )
    if not 0 < request.gpus <= len(allowed):
        return 0
    return max(1, allowed[request.gpus - 1] - headroom_bytes)
