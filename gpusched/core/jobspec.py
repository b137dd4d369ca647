"""Submitted job specs: Slurm-style option syntax, and the daemon's check of each field."""

from __future__ import annotations

import math
from typing import Any

from gpusched.core.errors import UsageError
from gpusched.core.models import DEFAULT_RETRY_DELAY_S, Constraints, Job, Request
from gpusched.core.syntax import DEPENDENCY_KINDS, RETRY_ON_CHOICES, WARN_SIGNALS

MAX_GPUS_PER_JOB = 64
MAX_PRIORITY = 10**6


def whole_number(spec: dict, key: str, default: int | None, low: int, high: int) -> int | None:
    value = spec.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UsageError(f"{key.replace('_', '-')} must be a whole number from {low} to {high}, "
                         f"not {value!r}")
    return value


def _number(spec: dict, key: str, low: float) -> float | None:
    value = spec.get(key)
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value < low):
        raise UsageError(f"{key.replace('_', '-')} must be a number of at least {low}, not {value!r}")
    return float(value)


def _int_list(spec: dict, key: str) -> tuple[int, ...]:
    value = spec.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, int) and v >= 0 for v in value):
        raise UsageError(f"{key.replace('_', '-')} must be a list of GPU indices")
    return tuple(value)


def check_constraints(spec: Any) -> Constraints:
    spec = spec or {}
    if not isinstance(spec, dict):
        raise UsageError("constraints must be a JSON object")
    capability = spec.get("min_compute_capability")
    if capability is not None and (not isinstance(capability, list) or len(capability) != 2
                                   or not all(isinstance(v, int) for v in capability)):
        raise UsageError("--min-compute-capability wants MAJOR.MINOR like 8.0")
    gpu_type = spec.get("gpu_type") or ""
    if not isinstance(gpu_type, str):
        raise UsageError("--gpu-type must be a string")
    return Constraints(gpu_ids=_int_list(spec, "gpu_ids"),
                       exclude_gpus=_int_list(spec, "exclude_gpus"), gpu_type=gpu_type,
                       min_gpu_total_mem_bytes=whole_number(spec, "min_gpu_total_mem_bytes", 0, 0, 2**60),
                       min_compute_capability=tuple(capability) if capability else None)


def check_job_spec(spec: Any, policies: list[str]) -> dict[str, Any]:
    """The Job fields of one submitted job, every value checked (the daemon trusts no client)."""
    if not isinstance(spec, dict):
        raise UsageError("each job must be a JSON object")
    command = spec.get("command")
    if (not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command)
            or not command[0]):
        raise UsageError("the job has no command; put it after `--`, e.g. "
                         "`gpusched submit -- python train.py`")
    name = spec.get("name") or ""
    if not isinstance(name, str) or len(name) > 200:
        raise UsageError("the job name must be a string of at most 200 characters")
    gpus = whole_number(spec, "gpus", 0, 0, MAX_GPUS_PER_JOB)
    # Cores asked for are a limit; a GPU job that did not ask is counted as using one
    # but never waits for it; a job without GPUs needs its one core (else a queue of
    # CPU jobs would all start at once).
    cpus = whole_number(spec, "cpus", None, 0, 100_000)
    cpus_required = cpus is not None or gpus == 0
    host_mem = whole_number(spec, "mem_bytes", None, 1, 2**60)
    mem = whole_number(spec, "gpu_mem_bytes", None, 1, 2**50)
    if mem is not None and gpus == 0:
        raise UsageError("--gpu-mem needs at least one GPU; add --gpus 1")
    constraints = check_constraints(spec.get("constraints"))
    if gpus == 0 and constraints != Constraints():
        raise UsageError("GPU constraints (--gpu-ids, --gpu-type, ...) need --gpus 1 or more")
    policy = spec.get("policy") or ""
    if policy and policy not in policies:
        raise UsageError(f"unknown policy {policy!r}; choose one of: {', '.join(policies)}")
    retry_on = spec.get("retry_on") or ["failed"]
    if not isinstance(retry_on, list) or not set(retry_on) <= set(RETRY_ON_CHOICES):
        raise UsageError(f"--retry-on takes: {', '.join(RETRY_ON_CHOICES)}")
    deps = spec.get("dependencies") or []
    if not isinstance(deps, list) or not all(
            isinstance(d, list) and len(d) == 2 and d[0] in DEPENDENCY_KINDS and
            isinstance(d[1], int) and not isinstance(d[1], bool) for d in deps):
        raise UsageError("dependencies must be [KIND, ID] pairs")
    retry_delay_s = _number(spec, "retry_delay_s", 0.0)
    warn_signal = whole_number(spec, "warn_signal", None, 1, 64)
    if warn_signal is not None and warn_signal not in WARN_SIGNALS:
        raise UsageError(f"warn-signal must be one the job's shim passes on "
                         f"({', '.join(str(int(s)) for s in WARN_SIGNALS)}), not {warn_signal}")
    return {
        "command": tuple(command), "name": name, "policy": policy,
        "request": Request(gpus, mem, constraints, 1 if cpus is None else cpus, host_mem,
                           cpus_required),
        "priority": whole_number(spec, "priority", 0, -MAX_PRIORITY, MAX_PRIORITY),
        "held": bool(spec.get("hold")), "dependencies": tuple((k, i) for k, i in deps),
        "kill_on_invalid_dep": bool(spec.get("kill_on_invalid_dep")),
        "time_limit_s": _number(spec, "time_limit_s", 1.0),
        "warn_signal": warn_signal,
        "warn_before_s": _number(spec, "warn_before_s", 0.0) or 0.0,
        "retries": whole_number(spec, "retries", 0, 0, 1000), "retry_on": tuple(retry_on),
        "retry_delay_s": DEFAULT_RETRY_DELAY_S if retry_delay_s is None else retry_delay_s,
    }


def job_spec(job: Job) -> dict[str, Any]:
    """The spec that check_job_spec turns back into this job's fields: what `resubmit`
    queues again. Not held: a hold is asked for anew (`resubmit --hold`)."""
    request, constraints = job.request, job.request.constraints
    capability = constraints.min_compute_capability
    return {
        "command": list(job.command), "name": job.name, "policy": job.policy,
        "gpus": request.gpus, "gpu_mem_bytes": request.gpu_mem_bytes,
        # Cores not asked for stay so: a GPU job then still never waits for one.
        "cpus": request.cpus if request.cpus_required else None,
        "mem_bytes": request.mem_bytes, "priority": job.priority, "hold": False,
        "constraints": {"gpu_ids": list(constraints.gpu_ids),
                        "exclude_gpus": list(constraints.exclude_gpus),
                        "gpu_type": constraints.gpu_type,
                        "min_gpu_total_mem_bytes": constraints.min_gpu_total_mem_bytes,
                        "min_compute_capability": list(capability) if capability else None},
        "retries": job.retries, "retry_on": list(job.retry_on),
        "retry_delay_s": job.retry_delay_s,
        "dependencies": [[kind, dep] for kind, dep in job.dependencies],
        "kill_on_invalid_dep": job.kill_on_invalid_dep, "time_limit_s": job.time_limit_s,
        "warn_signal": job.warn_signal, "warn_before_s": job.warn_before_s,
    }


RESUBMIT_CHANGES = ("gpus", "gpu_mem_bytes", "name", "priority", "time_limit_s", "cpus",
                    "mem_bytes", "hold")


def changed(spec: dict[str, Any], changes: Any) -> dict[str, Any]:
    """A job's spec with the changes `resubmit` may make (checked again like any spec)."""
    if not isinstance(changes, dict) or not set(changes) <= set(RESUBMIT_CHANGES):
        raise UsageError(f"resubmit may change only: {', '.join(RESUBMIT_CHANGES)}")
    if changes.get("gpus") == 0 and "gpu_mem_bytes" not in changes:
        # No GPUs now: what only a GPU job may ask for goes with them.
        spec = {**spec, "gpu_mem_bytes": None, "constraints": None}
    return {**spec, **changes}
