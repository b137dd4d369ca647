"""A Job made a queue row (store/rows.py reads one back): every column for an insert,
those that can change for an update, and how a column's default reads, so that the rows
of jobs alike store only what differs from it."""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from typing import Any

from gpusched.core.models import Job
from gpusched.store.rows import COLUMNS_RENAMED, JSON_TUPLES

# (column, Job field) of every column but the request's
_COLUMNS = [
    (COLUMNS_RENAMED.get(f.name, f.name), f.name) for f in fields(Job) if f.name != "request"
]


# What the jobs of one submit (a sweep's lines, an array's elements) differ in: the rest of
# each one's row is its template's (store.Store.insert_alike).
PER_JOB_FIELDS = (
    "id",
    "command",
    "job_key",
    "array_id",
    "array_index",
    "array_throttle",
    "stdout_path",
    "stderr_path",
    "pending_reason",
)

# Fixed at submit: an update need not rewrite (nor re-encode) them, the environment above
# all. The request (GPUs, memory, constraints, CPUs) is fixed too, and stored apart.
_SET_AT_SUBMIT = frozenset(
    {
        "command",
        "env",
        "cwd",
        "uid",
        "user",
        "submit_pid",
        "submitted_at",
        "dependencies",
        "retry_on",
        "retry_delay_s",
        "preemptible",
        "preempt_grace_s",
        "mem_growth",
        "job_key",
        "interactive",
        "gpu_mem_over",
        "pty",
        "container",
        "output_pattern",
        "error_pattern",
        "open_mode",
    }
)
_UPDATED_COLUMNS = [(c, n) for c, n in _COLUMNS if n not in _SET_AT_SUBMIT]


def job_to_row(job: Job, for_update: bool = False) -> dict[str, Any]:
    """The job's columns; for_update: only those that can change after submit (every
    start and end updates a job, so this runs several times per job)."""
    row = {c: getattr(job, n) for c, n in (_UPDATED_COLUMNS if for_update else _COLUMNS)}
    # Memory per GPU changes when a CUDA out-of-memory retry raises it (core/sched/gpuoom.py).
    row["gpu_mem_bytes"] = job.request.gpu_mem_bytes
    if not for_update:
        row["gpus"] = job.request.gpus
        row["cpus"], row["mem_bytes"] = job.request.cpus, job.request.mem_bytes
        row["cpus_required"] = job.request.cpus_required
        row["constraints"] = json.dumps(asdict(job.request.constraints))
    row["state"] = job.state.value
    for key, is_tuple in JSON_TUPLES.items():
        if key in row:
            row[key] = json.dumps(list(row[key]) if is_tuple else row[key])
    return row


def sql_literal(text: str) -> object:
    """A column default as PRAGMA table_info gives it: 'text', a number, or NULL."""
    if text.startswith("'"):
        return text[1:-1].replace("''", "'")
    if text.upper() == "NULL":
        return None
    return float(text) if "." in text else int(text)


def same_value(value: object, default: object) -> bool:
    """Whether storing value stores the column's default (False is 0, 10 is 10.0)."""
    if value is None or default is None:
        return value is default
    if isinstance(default, str) or isinstance(value, str):
        return value == default and type(value) is type(default)
    return value == default
