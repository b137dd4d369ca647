"""A job's run: its environment, its shim's spec, its files, and its run file's records.

The calls on processes (launching, signalling, measuring) live in gpusched/proc/seam.py.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from gpusched.proc import shim
from gpusched.core.models import GpuInfo, Job

# Variables the daemon owns in every job's environment; stale copies (from a job that
# submits jobs) are removed first so a job never inherits its parent's GPUs.
SCHEDULER_VARS = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES",
                  "GPUSCHED_JOB_ID", "GPUSCHED_NUM_GPUS", "GPUSCHED_GPU_MEM",
                  "GPUSCHED_ATTEMPT", "GPUSCHED_ARRAY_ID", "GPUSCHED_ARRAY_INDEX",
                  "GPUSCHED_TIME_LIMIT_END", "GPUSCHED_WARN_SIGNAL", "GPUSCHED_CPUS",
                  "GPUSCHED_MEM", "GPUSCHED_PROGRESS_FILE",
                  "MASTER_ADDR", "MASTER_PORT", "PET_MASTER_PORT")

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True)
class ExitRecord:
    exit_code: int | None
    signal: int | None
    ended_at: float
    error: str = ""


def job_environment(job: Job, gpus: Iterable[GpuInfo], master_port: int,
                    visible_devices: str, started_at: float,
                    defaults: Mapping[str, str] = {}) -> dict[str, str]:
    """The job's whole environment: the config's defaults ([jobs] env), what was captured
    at submit on top, then the scheduler's own variables."""
    gpus = tuple(gpus)
    env = {k: v for k, v in {**defaults, **job.env}.items() if k not in SCHEDULER_VARS}
    # MIG devices can only be named by UUID; whole GPUs by index when the config asks.
    ids = [g.uuid if visible_devices == "uuid" or g.parent_index is not None else str(g.index)
           for g in gpus]
    env.update({
        "CUDA_VISIBLE_DEVICES": ",".join(ids),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # CUDA's default order (fastest first) is not nvidia-smi's
        "NVIDIA_VISIBLE_DEVICES": ",".join(ids) if ids else "none",
        "GPUSCHED_JOB_ID": str(job.id),
        "GPUSCHED_NUM_GPUS": str(len(gpus)),
        "GPUSCHED_ATTEMPT": str(job.attempt),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
        # torchrun takes its --master-port from PET_MASTER_PORT, not MASTER_PORT: with
        # this, a plain `torchrun` in a job gets the job's own port too.
        "PET_MASTER_PORT": str(master_port),
    })
    if job.request.gpu_mem_bytes is not None:
        env["GPUSCHED_GPU_MEM"] = str(job.request.gpu_mem_bytes)
    # A job of --cpus 0 still runs a thread.
    threads = str(max(job.request.cpus, 1))
    env["GPUSCHED_CPUS"] = threads
    # Math libraries start a thread per core of the machine unless told otherwise: eight
    # jobs each spawning 64 threads is how a shared box grinds to a halt. The job's own
    # setting (from the submitting environment or --env) wins.
    for var in THREAD_VARS:
        env.setdefault(var, threads)
    if job.request.mem_bytes is not None:
        env["GPUSCHED_MEM"] = str(job.request.mem_bytes)
    if job.array_id is not None:
        env["GPUSCHED_ARRAY_ID"] = str(job.array_id)
        env["GPUSCHED_ARRAY_INDEX"] = str(job.array_index)
    if job.time_limit_s is not None:
        env["GPUSCHED_TIME_LIMIT_END"] = f"{started_at + job.time_limit_s:.3f}"
    if job.warn_signal is not None:
        env["GPUSCHED_WARN_SIGNAL"] = signal.Signals(job.warn_signal).name
    if job.stdout_path:
        env["GPUSCHED_PROGRESS_FILE"] = str(progress_path(job))
    return env


def progress_path(job: Job) -> Path:
    """Where gpusched.job.progress() writes: beside the job's logs, which the job's user
    can write in both modes (the job directory, or the user's log directory as root)."""
    return Path(job.stdout_path).parent / f"{job.id}.progress.json"


# A job's files lie side by side in the jobs directory, named by its id: ID.run.jsonl (see
# shim.RUN_FILE), ID.stdout.log and ID.stderr.log. No directory per job: on some
# filesystems each one costs the daemon most of a millisecond to make, for every job.
def run_file(jobs_root: str | Path, job_id: int) -> str:
    return os.path.join(jobs_root, f"{job_id}.{shim.RUN_FILE}")


def log_paths(jobs_root: str | Path, job_id: int) -> tuple[str, str]:
    """A job's stdout and stderr logs in user mode (system mode keeps them per user)."""
    return (os.path.join(jobs_root, f"{job_id}.stdout.log"),
            os.path.join(jobs_root, f"{job_id}.stderr.log"))


def _legacy_job_dir(jobs_root: str | Path, job_id: int) -> str:
    """Where a job started before the flat layout keeps its files (read across an upgrade)."""
    return os.path.join(jobs_root, str(job_id))


def run_spec(job: Job, env: Mapping[str, str], jobs_root: str, wake_path: str,
             grace_s: float, cgroup: Path | None = None, run_as: int | None = None) -> dict:
    """The spec a job's shim is launched with. The shim makes every file of the run
    (see shim.begin_run_file). run_as (system mode): the shim drops to this uid before
    the job touches any path."""
    return {"job_id": job.id, "run_file": run_file(jobs_root, job.id),
            "command": list(job.command), "env": dict(env), "cwd": job.cwd,
            "stdout": job.stdout_path, "stderr": job.stderr_path, "grace_s": grace_s,
            "wake": str(wake_path), "cpu_ids": list(job.cpu_ids),
            "cgroup": str(cgroup) if cgroup else "", "run_as": run_as}


_TAIL_BYTES = 8192  # holds the short "shim" and "exit" records, whatever the spec's size


def _records(data: bytes) -> list[dict]:
    """The whole lines of a run file (or of its tail), parsed; a partial line is left out."""
    records = []
    for line in data.split(b"\n")[:-1]:  # what follows the last newline is not written yet
        try:
            record = json.loads(line)
        except ValueError:
            continue  # the tail's cut-off first line
        if isinstance(record, dict):
            records.append(record)
    return records


@dataclass(frozen=True)
class RunState:
    """What a run file says so far."""

    shim: tuple[int, int] | None  # the shim's own record: (pid, shim.start_ticks)
    exit: ExitRecord | None  # the shim's, once the job has ended


def read_run(jobs_root: str | Path, job_id: int) -> RunState:
    """The run file's "shim" and "exit" records. Only its tail is read: this runs for every
    running job on every pass, and the spec before them may be long."""
    try:
        records = _tail_records(run_file(jobs_root, job_id))
    except FileNotFoundError:
        records = _legacy_records(_legacy_job_dir(jobs_root, job_id))
    except OSError:
        return RunState(None, None)
    shim_record = exit_record = None
    for data in records:
        try:
            if data.get("record") == "shim" and shim_record is None:
                shim_record = int(data["pid"]), int(data["start_ticks"])
            elif data.get("record") == "exit":
                exit_record = _exit_record(data)
        except (KeyError, TypeError, ValueError):
            continue  # not written by a shim of ours: as if absent
    return RunState(shim_record, exit_record)


def _exit_record(data: dict) -> ExitRecord:
    return ExitRecord(data.get("exit_code"), data.get("signal"), float(data.get("ended_at", 0)),
                      data.get("error", ""))


def _tail_records(path: str) -> list[dict]:
    with open(path, "rb") as run:
        size = run.seek(0, os.SEEK_END)
        run.seek(max(0, size - _TAIL_BYTES))
        return _records(run.read())


def _legacy_records(directory: str) -> list[dict]:
    """The records of a job whose shim predates the flat layout: a run file in the job's
    own directory, or, older still, a lone exit.json (it ran across an upgrade)."""
    try:
        return _tail_records(os.path.join(directory, shim.RUN_FILE))
    except OSError:
        pass
    try:
        with open(os.path.join(directory, shim.LEGACY_EXIT_FILE), "rb") as record:
            return [{"record": "exit", **json.loads(record.read())}]
    except (OSError, ValueError, TypeError):
        return []


def clear_run(jobs_root: str | Path, job_id: int) -> None:
    """Forget a finished run's record before the job is queued again."""
    directory = _legacy_job_dir(jobs_root, job_id)
    for path in (run_file(jobs_root, job_id), os.path.join(directory, shim.RUN_FILE),
                 os.path.join(directory, shim.LEGACY_EXIT_FILE)):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
