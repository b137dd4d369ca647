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
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from operator import itemgetter
from typing import Any

from gpusched.core.models import Constraints, Job, JobState, Request
from gpusched.core.spec.syntax import MAX_JOB_ID

# Columns stored as JSON, and whether their value is a tuple in the Job.
JSON_TUPLES = {
    "command": True,
    "env": False,
    "gpu_uuids": True,
    "gpu_indices": True,
    "dependencies": True,
    "retry_on": True,
    "cpu_ids": True,
    "preempted_jobs": True,
    "preempt_hold": True,
    "container": True,
}
# Job fields whose column keeps an older name (the file's schema is not changed for a name):
# the process watched for a run was a shim before the supervisor ran plain jobs itself.
COLUMNS_RENAMED = {"runner_pid": "shim_pid", "runner_start_time": "shim_start_time"}
BOOLEANS = (
    "cancel_requested",
    "held",
    "kill_on_invalid_dep",
    "warned",
    "timed_out",
    "mem_over",
    "oom_killed",
    "preemptible",
    "requeueing",
    "interactive",
    "warn_batch",
    "gpu_mem_stop",
    "pty",
)
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
        return lambda v: (
            type(v) is tuple
            and len(v) == len(items)
            and all(check(x) for check, x in zip(items, v))
        )
    if origin is dict:
        if args[0] in _EXACT and args[1] in _EXACT:  # a job's environment: dozens of items
            key_kind, value_kind = args
            return lambda v: (
                type(v) is dict
                and all(type(k) is key_kind and type(x) is value_kind for k, x in v.items())
            )
        key, value = (_checker(a) for a in args)
        return lambda v: type(v) is dict and all(key(k) and value(x) for k, x in v.items())
    if hint is type(None):
        return lambda v: v is None
    if hint is float:  # SQLite and JSON may hand back a whole number for a REAL
        return lambda v: type(v) in (int, float)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return lambda v: isinstance(v, hint)
    if isinstance(hint, type) and is_dataclass(hint):  # checked field by field, by _field_checks
        return lambda v: isinstance(v, hint)
    return lambda v: type(v) is hint  # int, str, bool: exactly (True is not a count)


def _field_checks(cls: type) -> list[tuple[str, Callable[[Any], bool]]]:
    hints = typing.get_type_hints(cls)
    return [(f.name, _checker(hints[f.name])) for f in fields(cls)]


# (the record's path from the Job, its checks): the job, its request, the request's constraints
_RECORD_CHECKS = [
    ((), _field_checks(Job)),
    (("request",), _field_checks(Request)),
    (("request", "constraints"), _field_checks(Constraints)),
]


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


def _request(job_id: int, values: dict[str, Any]) -> Request:
    """The request's columns, taken out of the row (an older schema lacks some: defaults)."""
    d = _REQUEST_DEFAULTS
    constraints = values.pop("constraints", None)
    return Request(
        values.pop("gpus", d.gpus),
        values.pop("gpu_mem_bytes", d.gpu_mem_bytes),
        d.constraints if constraints is None else _constraints(job_id, constraints),
        values.pop("cpus", d.cpus),
        values.pop("mem_bytes", d.mem_bytes),
        _boolean(values.pop("cpus_required", d.cpus_required)),
    )


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


class Shared:
    """Values many rows hold alike, decoded and checked once and then shared: a sweep's
    100,000 rows have one environment, one command, one request between them, and a
    restart on them must neither decode nor keep 100,000 copies (docs/scheduling.md).
    One per read of many rows; the values it hands out are never changed (Job is frozen)."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, Any], Any] = {}  # (column, stored) -> decoded value
        self.checked: set[object] = set()  # ids of shared values that passed their check

    def json(self, job_id: int, key: str, text: Any, is_tuple: bool) -> Any:
        found = self.values.get((key, text), _MISSING)
        if found is _MISSING:
            found = _json_column(job_id, key, text)
            if is_tuple:
                if not isinstance(found, list):
                    raise DamagedRow(job_id, f"{key} is not a list ({_short(text)})")
                found = tuple(tuple(v) if isinstance(v, list) else v for v in found)
            if isinstance(text, str):
                self.values[(key, text)] = found
        return found


_MISSING = object()
# Text columns that many rows hold alike: kept as one str object each (Shared).
_SHARED_TEXTS = (
    "cwd",
    "user",
    "name",
    "pending_reason",
    "end_reason",
    "boot_id",
    "job_key",
    "gpu_mem_reason",
    "runtime_reason",
    "policy",
    "last_attempt_end",
    "requeue_reason",
)


def row_to_job(row: sqlite3.Row, shared: Shared | None = None) -> Job:
    """The Job a row holds; raises DamagedRow naming the first field that is wrong."""
    return _decode(dict(zip(row.keys(), row)), shared or Shared())


def _decode(values: dict[str, Any], shared: Shared) -> Job:
    job_id = values["id"]
    if values["state"] not in STATES:
        raise DamagedRow(job_id, f"state {_short(values['state'])} is not a job state")
    values["state"] = JobState(values["state"])
    for field_name, column in COLUMNS_RENAMED.items():
        if column in values:
            values[field_name] = values.pop(column)
    for key, is_tuple in JSON_TUPLES.items():
        if key in values:  # else an older schema's row (gpusched doctor --repair): the default
            values[key] = shared.json(job_id, key, values[key], is_tuple)
    for key in BOOLEANS:
        if key in values:
            values[key] = _boolean(values[key])
    texts = shared.values
    for key in _SHARED_TEXTS:
        value = values.get(key)
        if type(value) is str:
            values[key] = texts.setdefault(("", value), value)
    values["request"] = _shared_request(job_id, values, shared)
    try:
        job = Job(**values)
    except TypeError as exc:  # a column the Job lacks, or one it needs missing
        raise DamagedRow(job_id, f"the row does not fit a job ({exc})") from None
    check_job(job, shared.checked)
    return job


def _shared_request(job_id: int, values: dict[str, Any], shared: Shared) -> Request:
    key = ("request", tuple(values.get(k) for k in _REQUEST_COLUMNS))
    request = shared.values.get(key)
    if request is None:
        request = shared.values[key] = _request(job_id, values)
    else:
        for column in _REQUEST_COLUMNS:
            values.pop(column, None)
    return request


_REQUEST_COLUMNS = ("gpus", "gpu_mem_bytes", "constraints", "cpus", "mem_bytes", "cpus_required")


def _boolean(value: Any) -> Any:
    """An INTEGER 0/1 column as a bool; anything else as it is, for check_job to name."""
    return bool(value) if type(value) is int else value


def check_job(job: Job, checked: set[object] | None = None) -> None:
    """Raise DamagedRow unless every field holds a value of its declared type. `checked`:
    ids of shared values (Shared) found right before, for a field of the same name."""
    checked = set() if checked is None else checked
    for path, checks in _RECORD_CHECKS:
        record = job
        for step in path:
            record = getattr(record, step)
        if path and id(record) in checked:
            continue  # a request shared with rows checked before
        for name, ok in checks:
            value = getattr(record, name)
            # A scalar's check depends on its type only; a tuple's or dict's on its items.
            kind = type(value)
            seen = (name, id(value)) if kind is tuple or kind is dict else (name, kind)
            if seen in checked:
                continue
            if not ok(value):
                raise DamagedRow(
                    job.id,
                    f"{COLUMNS_RENAMED.get(name, name)} holds {_short(value)}, which a job cannot have",
                )
            checked.add(seen)
        if path:
            checked.add(id(record))
    if not job.command:
        raise DamagedRow(job.id, "command is empty")
    if not 0 < job.id <= MAX_JOB_ID:
        raise DamagedRow(job.id, f"id {job.id} is outside the job ids (1 to {MAX_JOB_ID:,})")


# Columns that differ from one job of a sweep to the next, with the types they may hold
# (the command: its JSON text, decoded by _own_command).
_OWN = {
    "id": (int,),
    "stdout_path": (str,),
    "stderr_path": (str,),
    "submitted_at": (int, float),
    "array_index": (int, type(None)),
    "submit_pid": (int, type(None)),
    "pending_reason": (str,),
    "job_key": (str,),
    "command": (str,),
}
_FIELDS = tuple(f.name for f in fields(Job))
_loads = json.JSONDecoder().decode


WORDS_KEPT = 4096  # words of recent commands shared with the rows after them


def _own_command(text: str, seen: dict[str, str]) -> tuple[str, ...] | None:
    """The command a row's JSON text holds, None unless it is one a job can have (the full
    decode then names what is wrong). A word that a recent row had (`seen`) is that row's
    object: a sweep's lines share most of their words (the program, the options, a grid's
    values), and 100,000 copies of each would cost more than the jobs' own words."""
    try:
        words = _loads(text)
    except ValueError:
        return None
    if type(words) is not list or not words:
        return None
    if len(seen) > WORDS_KEPT:
        seen.clear()
    for at, word in enumerate(words):
        if type(word) is not str:
            return None
        words[at] = seen.setdefault(word, word)
    return tuple(words)


class RowDecoder:
    """Many rows of one query (plain tuples, in `names` order) made Jobs. The first row of
    each kind is decoded and checked in full; a row alike in all but its own columns
    (_OWN: its id, log paths, command...) is that job again with those put in, after a
    check of their types: loading 100,000 queued jobs, each line of a sweep its own
    command, costs little more than reading them."""

    def __init__(self, names: list[str]):
        self.names, self.shared = names, Shared()
        self._templates: dict[tuple[Any, ...], list[Any]] = {}
        own = [names.index(c) for c in _OWN if c in names]
        shared = [i for i in range(len(names)) if i not in own]
        self._key = itemgetter(*shared) if len(own) == len(_OWN) and len(shared) > 1 else None
        self._own = [(_FIELDS.index(c), names.index(c), _OWN[c]) for c in _OWN if c in names]
        self._reason_slot = _FIELDS.index("pending_reason")
        self._id_slot = _FIELDS.index("id")
        self._command_slot = _FIELDS.index("command")
        self._words: dict[str, str] = {}  # words of recent commands (_own_command)

    def job(self, row: tuple[Any, ...]) -> Job:
        """The row's Job; raises DamagedRow naming the first field that is wrong."""
        if self._key is None:
            return _decode(dict(zip(self.names, row)), self.shared)
        key = self._key(row)
        template = self._templates.get(key)
        if template is None:
            job = _decode(dict(zip(self.names, row)), self.shared)
            self._templates[key] = [getattr(job, name) for name in _FIELDS]
            return job
        values = template.copy()
        for slot, at, kinds in self._own:
            value = row[at]
            if type(value) not in kinds:  # decoded in full, which names what is wrong
                return _decode(dict(zip(self.names, row)), self.shared)
            values[slot] = value
        command = _own_command(values[self._command_slot], self._words)
        if command is None:
            return _decode(dict(zip(self.names, row)), self.shared)
        values[self._command_slot] = command
        if not 0 < values[self._id_slot] <= MAX_JOB_ID:  # decoded in full, which says so
            return _decode(dict(zip(self.names, row)), self.shared)
        reason = values[self._reason_slot]  # alike for most of a sweep: one str for all
        values[self._reason_slot] = self.shared.values.setdefault(("", reason), reason)
        return Job(*values)
