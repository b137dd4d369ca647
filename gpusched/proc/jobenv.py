"""The job-environment contract: every variable gpusched sets in a job, in one table.

The daemon writes them (job_environment); gpusched.job reads them inside the job, so this
module stays standard library only and cheap to import. README.md's "What a job sees"
lists the same variables (a test keeps them in step).
"""

from __future__ import annotations

import itertools
import signal
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from gpusched.proc import runfile

if TYPE_CHECKING:
    from gpusched.core.models import GpuInfo, Job

VARIABLES: dict[str, str] = {}
"""name -> what the job finds in it: every variable gpusched sets."""


def _variable(name: str, meaning: str) -> str:
    VARIABLES[name] = meaning
    return name


CUDA_VISIBLE_DEVICES = _variable(
    "CUDA_VISIBLE_DEVICES", "the job's GPUs, as UUIDs or indices; empty without GPUs"
)
CUDA_DEVICE_ORDER = _variable(
    "CUDA_DEVICE_ORDER", "PCI_BUS_ID, so that CUDA numbers GPUs as nvidia-smi does"
)
NVIDIA_VISIBLE_DEVICES = _variable(
    "NVIDIA_VISIBLE_DEVICES", "the same GPUs, for containers the job starts (none without GPUs)"
)
JOB_ID = _variable("GPUSCHED_JOB_ID", "the job's id")
NUM_GPUS = _variable("GPUSCHED_NUM_GPUS", "how many GPUs the job has")
JOB_GPUS = _variable(
    "GPUSCHED_JOB_GPUS",
    "the job's GPUs by index, as nvidia-smi numbers "
    "them (Slurm's SLURM_JOB_GPUS); only for a job with GPUs",
)
GPU_MEM = _variable("GPUSCHED_GPU_MEM", "bytes per GPU, when the job asked for --gpu-mem")
MASTER_ADDR = _variable("MASTER_ADDR", "127.0.0.1")
MASTER_PORT = _variable("MASTER_PORT", "a port no other running job has, held for the job")
PET_MASTER_PORT = _variable("PET_MASTER_PORT", "the same port, under the name torchrun reads")
ATTEMPT = _variable("GPUSCHED_ATTEMPT", "1, then 2, 3, ... when --retries queues it again")
RESTARTS = _variable(
    "GPUSCHED_RESTARTS",
    "0, then 1, 2, ... each time the job was preempted or "
    "requeued (`gpusched requeue`) and started again",
)
CPUS = _variable("GPUSCHED_CPUS", "the job's cores (at least 1)")
MEM = _variable("GPUSCHED_MEM", "the job's host memory in bytes, when it asked for --mem")
OMP_NUM_THREADS = _variable("OMP_NUM_THREADS", "its cores, unless the job's environment sets it")
MKL_NUM_THREADS = _variable("MKL_NUM_THREADS", "its cores, unless the job's environment sets it")
ARRAY_ID = _variable("GPUSCHED_ARRAY_ID", "the array's id, for an element of an --array")
ARRAY_INDEX = _variable("GPUSCHED_ARRAY_INDEX", "this element's index in its --array")
# Slurm's SLURM_ARRAY_TASK_COUNT, _MIN, _MAX and _STEP, under gpusched's names.
ARRAY_COUNT = _variable("GPUSCHED_ARRAY_COUNT", "how many elements its --array has")
ARRAY_MIN = _variable("GPUSCHED_ARRAY_MIN", "the lowest index of its --array")
ARRAY_MAX = _variable("GPUSCHED_ARRAY_MAX", "the highest index of its --array")
ARRAY_STEP = _variable(
    "GPUSCHED_ARRAY_STEP",
    "the step between its --array's indices (4 for 0-15:4; 1 when they are not evenly spaced)",
)
TIME_LIMIT_END = _variable("GPUSCHED_TIME_LIMIT_END", "when --time runs out, in epoch seconds")
WARN_SIGNAL = _variable("GPUSCHED_WARN_SIGNAL", "the signal --signal sends before the limit")
PROGRESS_FILE = _variable("GPUSCHED_PROGRESS_FILE", "where gpusched.job.progress() reports")
RUN_TOKEN = _variable(
    "GPUSCHED_RUN_TOKEN",
    "names this attempt (id.attempt.start time): how gpusched finds "
    "the job's processes (and stops them) if its shim dies",
)

# Math libraries start a thread per core of the machine unless told otherwise: eight jobs
# each spawning 64 threads is how a shared box grinds to a halt. These are only defaults:
# the job's own setting (from the submitting environment or --env) wins.
THREAD_VARS = (OMP_NUM_THREADS, MKL_NUM_THREADS)
# Variables the daemon owns in every job's environment; stale copies (from a job that
# submits jobs) are removed first so a job never inherits its parent's GPUs.
SCHEDULER_VARS = tuple(name for name in VARIABLES if name not in THREAD_VARS)


def array_environment(indices: Iterable[int]) -> dict[str, str]:
    """An array element's variables about its whole array: count, lowest, highest, step."""
    ordered = sorted(set(indices))
    if not ordered:
        return {}
    gaps = {b - a for a, b in itertools.pairwise(ordered)}
    step = gaps.pop() if len(gaps) == 1 else 1
    return {
        ARRAY_COUNT: str(len(ordered)),
        ARRAY_MIN: str(ordered[0]),
        ARRAY_MAX: str(ordered[-1]),
        ARRAY_STEP: str(step),
    }


def job_environment(
    job: Job,
    gpus: Iterable[GpuInfo],
    master_port: int,
    visible_devices: str,
    started_at: float,
    run_token: str,
    defaults: Mapping[str, str] = {},
    own_stdout: str = "",
) -> dict[str, str]:
    """The job's whole environment: the config's defaults ([jobs] env), what was captured
    at submit on top, then the scheduler's own variables. run_token: new for each attempt
    (proc/leftovers.py). own_stdout: gpusched's own stdout log of the job, beside which its
    progress file goes (its output may go to a file of the user's)."""
    gpus = tuple(gpus)
    env = {k: v for k, v in {**defaults, **job.env}.items() if k not in SCHEDULER_VARS}
    # MIG devices can only be named by UUID; whole GPUs by index when the config asks.
    ids = [
        g.uuid if visible_devices == "uuid" or g.parent_index is not None else str(g.index)
        for g in gpus
    ]
    env.update(
        {
            CUDA_VISIBLE_DEVICES: ",".join(ids),
            CUDA_DEVICE_ORDER: "PCI_BUS_ID",  # CUDA's default order (fastest first) is not nvidia-smi's
            NVIDIA_VISIBLE_DEVICES: ",".join(ids) if ids else "none",
            JOB_ID: str(job.id),
            NUM_GPUS: str(len(gpus)),
            ATTEMPT: str(job.attempt),
            RESTARTS: str(job.restarts),
            MASTER_ADDR: "127.0.0.1",
            MASTER_PORT: str(master_port),
            # torchrun takes its --master-port from PET_MASTER_PORT, not MASTER_PORT: with
            # this, a plain `torchrun` in a job gets the job's own port too.
            PET_MASTER_PORT: str(master_port),
            RUN_TOKEN: run_token,
        }
    )
    if gpus:
        env[JOB_GPUS] = ",".join(str(g.index) for g in gpus)
    if job.request.gpu_mem_bytes is not None:
        env[GPU_MEM] = str(job.request.gpu_mem_bytes)
    # A job of --cpus 0 still runs a thread.
    threads = str(max(job.request.cpus, 1))
    env[CPUS] = threads
    for var in THREAD_VARS:
        env.setdefault(var, threads)
    if job.request.mem_bytes is not None:
        env[MEM] = str(job.request.mem_bytes)
    if job.array_id is not None:
        env[ARRAY_ID] = str(job.array_id)
        env[ARRAY_INDEX] = str(job.array_index)
    if job.time_limit_s is not None:
        env[TIME_LIMIT_END] = f"{started_at + job.time_limit_s:.3f}"
    if job.warn_signal is not None:
        env[WARN_SIGNAL] = signal.Signals(job.warn_signal).name
    if own_stdout or job.stdout_path:  # beside gpusched's own logs, never in the user's
        env[PROGRESS_FILE] = runfile.progress_path(own_stdout or job.stdout_path, job.id)
    return env
