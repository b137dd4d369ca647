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
# Frameworks' own caps, for a job that shares its GPUs (--gpu-mem): set from its promise.
XLA_MEM_FRACTION = _variable(
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "JAX's share of each GPU: --gpu-mem over the smallest of its GPUs, when it shares them",
)
XLA_PREALLOCATE = _variable(
    "XLA_PYTHON_CLIENT_PREALLOCATE", "false (JAX takes memory as it needs it), when it shares"
)
TF_ALLOW_GROWTH = _variable(
    "TF_FORCE_GPU_ALLOW_GROWTH", "true (TensorFlow takes memory as it needs it), when it shares"
)
# NVIDIA MPS, with [memory] mps = true (proc/mps.py): a hard cap for a job that shares.
MPS_PIPE = _variable(
    "CUDA_MPS_PIPE_DIRECTORY", "gpusched's MPS control daemon, for a job that shares under MPS"
)
MPS_MEM_LIMIT = _variable(
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "--gpu-mem on each of its GPUs (0=10240M,1=10240M), for a job that shares under MPS",
)
MPS_THREADS = _variable(
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "memory.mps_thread_pct, for a job that shares under MPS (unless 100)",
)

# Math libraries start a thread per core of the machine unless told otherwise: eight jobs
# each spawning 64 threads is how a shared box grinds to a halt. These are only defaults:
# the job's own setting (from the submitting environment or --env) wins.
THREAD_VARS = (OMP_NUM_THREADS, MKL_NUM_THREADS)
# So are the frameworks' memory caps: a job that knows better sets its own.
FRAMEWORK_VARS = (XLA_MEM_FRACTION, XLA_PREALLOCATE, TF_ALLOW_GROWTH)
# MPS's are gpusched's only while it runs MPS: without it, a user's own MPS setup stands.
MPS_VARS = (MPS_PIPE, MPS_MEM_LIMIT, MPS_THREADS)
# Variables the daemon owns in every job's environment; stale copies (from a job that
# submits jobs) are removed first so a job never inherits its parent's GPUs.
SCHEDULER_VARS = tuple(
    name for name in VARIABLES if name not in (*THREAD_VARS, *FRAMEWORK_VARS, *MPS_VARS)
)


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


def framework_caps(gpu_mem_bytes: int, gpus: Iterable[GpuInfo]) -> dict[str, str]:
    """JAX's and TensorFlow's caps for a job that shares its GPUs: JAX takes a fraction of
    each GPU's total, so the smallest GPU's (rounded down) keeps it within its promise on
    all of them; both grow as they need rather than taking it all at their start."""
    smallest = min((g.mem_total_bytes for g in gpus if g.mem_total_bytes > 0), default=0)
    caps = {XLA_PREALLOCATE: "false", TF_ALLOW_GROWTH: "true"}
    if smallest:
        fraction = max(min(gpu_mem_bytes * 1000 // smallest, 1000), 1) / 1000
        caps[XLA_MEM_FRACTION] = f"{fraction:.3f}"
    return caps


def mps_caps(gpu_mem_bytes: int, gpu_count: int, pipe_dir: str, thread_pct: int) -> dict[str, str]:
    """A sharing job's MPS client settings: the control daemon's pipe, and its memory
    limit on each GPU, numbered as the job sees them (0.. in CUDA_VISIBLE_DEVICES)."""
    limit_mib = max(gpu_mem_bytes // 2**20, 1)
    caps = {
        MPS_PIPE: pipe_dir,
        MPS_MEM_LIMIT: ",".join(f"{i}={limit_mib}M" for i in range(gpu_count)),
    }
    if thread_pct < 100:
        caps[MPS_THREADS] = str(thread_pct)
    return caps


def job_environment(
    job: Job,
    gpus: Iterable[GpuInfo],
    master_port: int,
    visible_devices: str,
    started_at: float,
    run_token: str,
    defaults: Mapping[str, str] = {},
    own_stdout: str = "",
    mps: tuple[str, int] | None = None,
) -> dict[str, str]:
    """The job's whole environment: the config's defaults ([jobs] env), what was captured
    at submit on top, then the scheduler's own variables. run_token: new for each attempt
    (proc/leftovers.py). own_stdout: gpusched's own stdout log of the job, beside which its
    progress file goes (its output may go to a file of the user's). mps, with memory.mps
    on: the pipe directory of gpusched's MPS control daemon ("" when the job is not to be
    its client) and the thread percentage; inherited MPS variables are dropped."""
    gpus = tuple(gpus)
    owned = SCHEDULER_VARS + (MPS_VARS if mps is not None else ())
    env = {k: v for k, v in {**defaults, **job.env}.items() if k not in owned}
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
    gpu_mem = job.request.gpu_mem_bytes
    if gpu_mem is not None:
        env[GPU_MEM] = str(gpu_mem)
    if gpu_mem is not None and gpus:  # it shares its GPUs: cap it at its promise
        for var, value in framework_caps(gpu_mem, gpus).items():
            env.setdefault(var, value)
        if mps and mps[0]:
            env.update(mps_caps(gpu_mem, len(gpus), *mps))
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
