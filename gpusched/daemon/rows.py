"""A queue row made a Job, checked field by field: a row that does not decode is damaged, not fatal.

A row can be spoiled by hand (an UPDATE in the sqlite3 shell), by a bug, or by damage that
the file's integrity check cannot see (a valid page holding a wrong value). Such a row is
quarantined: reported and skipped, never scheduled. The checks follow the Job dataclass's
own annotations, so a field added to Job is checked without a line here.
"""

from __future__ import annotations

import enum
import json
import sqlite3
import types
import typing
from dataclasses import fields, is_dataclass
from typing import Any, Callable

from gpusched.core.models import Constraints, Job, JobState, Request

# Columns stored as JSON, and whether their value is a tuple in the Job.
JSON_TUPLES = {"command": True, "env": False, "gpu_uuids": True, "gpu_indices": True,
               "dependencies": True, "retry_on": True, "cpu_ids": True,
               "preempted_jobs": True, "preempt_hold": True, "container": True}
BOOLEANS = ("cancel_requested", "held", "kill_on_invalid_dep", "warned", "timed_out",
            "mem_over", "oom_killed", "preemptible", "requeueing", "interactive", "warn_batch")
STATES = tuple(state.value for state in JobState)


class DamagedRow(ValueError):
    """A row that is not a job gpusched could have written: its id and why, in words."""

    def __init__(self, job_id: Any, reason: str):
        super().__init__(f"job {job_id}: {reason}")
        self.job_id, self.reason = job_id, reason


_EXACT = (int, str, bool)  # types checked exactly (True is not a count)


def _checker(hint: Any) -> Callable[[Any], bool]:
    """A test that a value fits a type annotation (the subset Job's fields use)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if all(a in _EXACT or a in (float, type(None)) for a in args):  # `float | None`...
            # One set lookup: SQLite and JSON may hand back a whole number for a REAL.
            kinds = frozenset(args) | ({int} if float in args else set())
            return lambda v: type(v) in kinds
        alternatives = [_checker(a) for a in args]
        return lambda v: any(check(v) for check in alternatives)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            if args[0] in _EXACT:  # a test per item without a call per item: rows decode often
                kind = args[0]
                return lambda v: type(v) is tuple and all(type(x) is kind for x in v)
            item = _checker(args[0])
            return lambda v: type(v) is tuple and all(map(item, v))
        items = [_checker(a) for a in args]
        return lambda v: (type(v) is tuple and len(v) == len(items)
                          and all(check(x) for check, x in zip(items, v)))
    if origin is dict:
        if args[0] in _EXACT and args[1] in _EXACT:  # a job's environment: dozens of items
            key_kind, value_kind = args
            return lambda v: type(v) is dict and all(
                type(k) is key_kind and type(x) is value_kind for k, x in v.items())
        key, value = (_checker(a) for a in args)
        return lambda v: type(v) is dict and all(key(k) and value(x) for k, x in v.items())
    if hint is type(None):
        return lambda v: v is None
    if hint is float:  # SQLite and JSON may hand back a whole number for a REAL
        return lambda v: type(v) in (int, float)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return lambda v: isinstance(v, hint)
    if is_dataclass(hint):  # checked field by field, by _field_checks
        return lambda v: isinstance(v, hint)
    return lambda v: type(v) is hint  # int, str, bool: exactly (True is not a count)


def _field_checks(cls: type) -> list[tuple[str, Callable[[Any], bool]]]:
    hints = typing.get_type_hints(cls)
    return [(f.name, _checker(hints[f.name])) for f in fields(cls)]


# (the record's path from the Job, its checks): the job, its request, the request's constraints
_RECORD_CHECKS = [((), _field_checks(Job)), (("request",), _field_checks(Request)),
                  (("request", "constraints"), _field_checks(Constraints))]


def _json_column(job_id: int, key: str, text: Any) -> Any:
    if not isinstance(text, str):
        raise DamagedRow(job_id, f"{key} holds {text!r}, not JSON text")
    try:
        return json.loads(text)
    except ValueError:
        raise DamagedRow(job_id, f"{key} is not valid JSON ({_short(text)})") from None


def _constraints(job_id: int, text: Any) -> Constraints:
    data = _json_column(job_id, "constraints", text)
    try:
        for key in ("gpu_ids", "exclude_gpus", "min_compute_capability"):
            if data.get(key) is not None:
                data[key] = tuple(data[key])
        return Constraints(**data)
    except (AttributeError, TypeError):
        raise DamagedRow(job_id, f"constraints are not a GPU constraint ({_short(text)})") from None


_REQUEST_DEFAULTS = Request()


def _request(job_id: int, values: dict) -> Request:
    """The request's columns, taken out of the row (an older schema lacks some: defaults)."""
    d = _REQUEST_DEFAULTS
    constraints = values.pop("constraints", None)
    return Request(values.pop("gpus", d.gpus), values.pop("gpu_mem_bytes", d.gpu_mem_bytes),
                   d.constraints if constraints is None else _constraints(job_id, constraints),
                   values.pop("cpus", d.cpus), values.pop("mem_bytes", d.mem_bytes),
                   _boolean(values.pop("cpus_required", d.cpus_required)))


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def row_to_job(row: sqlite3.Row) -> Job:
    """The Job a row holds; raises DamagedRow naming the first field that is wrong."""
    values = dict(zip(row.keys(), row))  # a tenth of the time of row[key] for each key
    job_id = values["id"]
    if values["state"] not in STATES:
        raise DamagedRow(job_id, f"state {_short(values['state'])} is not a job state")
    values["state"] = JobState(values["state"])
    for key, is_tuple in JSON_TUPLES.items():
        if key not in values:
            continue  # an older schema's row (gpusched doctor --repair): the default
        value = _json_column(job_id, key, values[key])
        if is_tuple:
            if not isinstance(value, list):
                raise DamagedRow(job_id, f"{key} is not a list ({_short(values[key])})")
            value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        values[key] = value
    for key in BOOLEANS:
        if key in values:
            values[key] = _boolean(values[key])
    values["request"] = _request(job_id, values)
    try:
        job = Job(**values)
    except TypeError as exc:  # a column the Job lacks, or one it needs missing
        raise DamagedRow(job_id, f"the row does not fit a job ({exc})") from None
    check_job(job)
    return job


def _boolean(value: Any) -> Any:
    """An INTEGER 0/1 column as a bool; anything else as it is, for check_job to name."""
    return bool(value) if type(value) is int else value


def check_job(job: Job) -> None:
    """Raise DamagedRow unless every field holds a value of its declared type."""
    for path, checks in _RECORD_CHECKS:
        record = job
        for step in path:
            record = getattr(record, step)
        for name, ok in checks:
            value = getattr(record, name)
            if not ok(value):
                raise DamagedRow(job.id, f"{name} holds {_short(value)}, which a job cannot have")
    if not job.command:
        raise DamagedRow(job.id, "command is empty")
