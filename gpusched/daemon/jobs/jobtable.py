"""The daemon's tables of active jobs (id -> Job), which hold a pending job alike with others
as one template they share: 100,000 pending jobs of a sweep cost a dict entry each, not a Job.

A Job is about 600 bytes of slots, plus its own log paths; a sweep's jobs differ in little
more than their id. A pending job whose logs are gpusched's own (worked out again from its id)
is held as a template: a Job with id 0 (no job has it), no log paths, and for an array element
its index less its id (an array's elements are numbered as their ids are), and its pending
reason with the id marked (a held job's names it: `gpusched release 12`). The whole Job is
built again when it is asked for, equal to the one put in. Running and finished jobs, and
jobs with their own --output or --error files, are held whole.

A sweep whose lines each differ (`submit --from-file`, each line its own arguments) would
have a template per line, as large as a Job. Its jobs share a template in all but their
command, job key and submit time, held beside it in a Distinct entry: about 60 bytes plus
the command's own words, whatever the job's other 70 fields hold.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, KeysView, MutableMapping
from operator import attrgetter
from typing import Any, TypeVar, final, overload

from gpusched.core.models import Job, JobState
from gpusched.core.sched.memestimate import job_key as derived_key

_OWN = ("id", "stdout_path", "stderr_path", "array_index")
# What a Distinct entry holds of its own job; its template holds the first job's.
_DISTINCT = ("command", "submitted_at", "job_key")
_SLOTS = Job.__slots__
_ID, _STDOUT, _STDERR, _INDEX = (_SLOTS.index(name) for name in _OWN)
_COMMAND, _SUBMITTED, _KEY = (_SLOTS.index(name) for name in _DISTINCT)
# What a template is looked up by, besides its environment and request (by identity, which
# the template keeps alive: a dict has no hash, a Request's is Python code), the array index
# less the id, the pending reason, id marked, and the program (the display name of a job
# without --name). (Its state is pending.)
_shared_values = attrgetter(
    *(
        name
        for name in _SLOTS
        if name not in (*_OWN, *_DISTINCT, "env", "request", "pending_reason", "state")
    )
)
_all_values = attrgetter(*_SLOTS)
_REASON = _SLOTS.index("pending_reason")
_PENDING = JobState.PENDING
# Stands for the job's id in a template's pending reason; no reason holds it.
ID_MARK = "\x00"
_MISSING = object()
FIRST_PRUNE = 64  # templates kept before the first look for unused ones
VALUES_KEPT = 64  # templates whose values are kept to build jobs from
_T = TypeVar("_T")


@final  # template_of() tells it by `type(entry) is Distinct`
class Distinct:
    """A pending job held by its template and the few fields it differs in (_DISTINCT),
    which answers as the template does for everything else (a Job's fields and properties,
    read through to it): what JobTable.alike() gives for such a job."""

    __slots__ = ("template", "command", "submitted_at", "_job_key")
    id = 0  # as a template's: the job is built from it (JobTable)

    def __init__(
        self, template: Job, command: tuple[str, ...], submitted_at: float, job_key: str | None
    ):
        """job_key None: the one its command gives (core/sched/memestimate.py), as a sweep's
        lines without --name have: not a second copy of each line."""
        self.template, self.command = template, command
        self.submitted_at, self._job_key = submitted_at, job_key

    @property
    def job_key(self) -> str:
        key = self._job_key
        return derived_key(self.template.name, self.command) if key is None else key

    is_running = Job.is_running
    display_name = Job.display_name


for _name in _SLOTS:
    if _name not in (*_DISTINCT, "id"):  # in C: an alike() reader reads thousands of these
        setattr(Distinct, _name, property(attrgetter(f"template.{_name}")))
del _name


def template_of(entry: Job | Distinct) -> Job:
    """The template a table entry is (or is held by), or the whole job it is."""
    return entry.template if type(entry) is Distinct else entry


class Kinds:
    """The templates that the tables of one daemon share. log_paths(user, job_id): a job's
    own stdout and stderr logs (proc/runfile.py's own_log_paths); in_use(): the entries
    that keep templates."""

    def __init__(
        self,
        log_paths: Callable[[str, int], tuple[str, str]],
        in_use: Callable[[], Iterable[Job]] = lambda: (),
    ):
        self._log_paths = log_paths
        self._by_key: dict[tuple[Any, ...], Job] = {}
        # id(template) -> (template, its slots' values), to build from: the templates last
        # built from only (at most VALUES_KEPT), since jobs alike in little (other names,
        # resources, dependencies) have a template each, whose values would cost as much
        # again as the template.
        self._values: dict[int, tuple[Job, list[Any]]] = {}
        self._prune_at = FIRST_PRUNE
        # The last key looked up, and its template.
        self._last: tuple[tuple[Any, ...], Job] | None = None
        self.in_use = in_use

    def __len__(self) -> int:
        return len(self._by_key)

    def lean(self, job: Job) -> Job:
        """What a table holds for job: the template it shares with jobs alike (with the
        fields it differs in: Distinct, typed as the Job it answers for), or the job."""
        if job.state is not _PENDING or (job.stdout_path, job.stderr_path) != self._log_paths(
            job.user, job.id
        ):
            return job
        reason, job_id = job.pending_reason, str(job.id)
        if job_id in reason:
            if ID_MARK in reason:
                return job
            reason = reason.replace(job_id, ID_MARK)
        index = job.array_index
        offset = None if index is None else index - job.id
        command = job.command
        key = (
            _shared_values(job),
            id(job.env),
            id(job.request),
            offset,
            reason,
            command[0] if command else None,
        )
        last = self._last
        if last is not None and key == last[0]:
            template = last[1]  # as the job before (a sweep comes in a run): no hash of the key
        else:
            found = self._by_key.get(key)
            template = self._add(key, job, offset, reason) if found is None else found
            self._last = (key, template)
        job_key: str | None
        at, job_key = job.submitted_at, job.job_key
        same_at = at == template.submitted_at and type(at) is type(template.submitted_at)
        if command == template.command and same_at and job_key == template.job_key:
            return template
        # The template's own objects where they are equal: one float, one str for all.
        if job_key == template.job_key:
            job_key = template.job_key
        elif job_key == derived_key(template.name, command):
            job_key = None
        # A Distinct reads as a Job (its other fields are properties made from Job's slots).
        return Distinct(  # type: ignore[return-value]
            template, command, template.submitted_at if same_at else at, job_key
        )

    def _add(self, key: tuple[Any, ...], job: Job, offset: int | None, reason: str) -> Job:
        if len(self._by_key) >= self._prune_at:
            self._prune()
        values = list(_all_values(job))
        values[_ID], values[_STDOUT], values[_STDERR], values[_INDEX] = 0, "", "", offset
        values[_REASON] = reason
        template = Job(*values)
        self._by_key[key] = template
        return template

    def _prune(self) -> None:
        """Forget the templates no job holds any more (reasons change, jobs start), once
        they have doubled since the last look: a look reads every entry."""
        used = {id(template_of(entry)) for entry in self.in_use() if not entry.id}
        self._by_key = {
            key: template for key, template in self._by_key.items() if id(template) in used
        }
        self._values, self._last = {}, None
        self._prune_at = max(FIRST_PRUNE, 2 * len(self._by_key))

    def build(self, job_id: int, entry: Job | Distinct) -> Job:
        """The whole job that a template (or Distinct entry) holds for job_id."""
        template = template_of(entry)
        found = self._values.get(id(template))
        if found is None or found[0] is not template:
            if len(self._values) >= VALUES_KEPT:
                self._values.clear()
            found = self._values[id(template)] = (template, list(_all_values(template)))
        values = found[1].copy()
        values[_ID] = job_id
        values[_STDOUT], values[_STDERR] = self._log_paths(template.user, job_id)
        if template.array_index is not None:
            values[_INDEX] = template.array_index + job_id
        if ID_MARK in template.pending_reason:
            values[_REASON] = template.pending_reason.replace(ID_MARK, str(job_id))
        if entry is not template:
            values[_COMMAND], values[_SUBMITTED] = entry.command, entry.submitted_at
            values[_KEY] = entry.job_key
        return Job(*values)

    def passing(self, entries: Iterable[tuple[int, Job]]) -> Iterator[Job]:
        """The jobs of (id, entry) pairs as the pending queue reads them (their shape and
        place in line: core/sched/pendingqueue.py), each valid only until the next is asked for:
        one object per template, its id and array index (and a Distinct entry's own fields)
        changed in place. Their log paths
        and pending reasons are the template's: no reader of these looks at them, and
        working out 100,000 log paths took a third of the turn that queued the jobs."""
        cursors: dict[int, Job] = {}
        changed: set[int] = set()  # templates whose cursor holds a Distinct entry's fields
        put = object.__setattr__  # Job is frozen
        for job_id, entry in entries:
            if entry.id:
                yield entry
                continue
            template = template_of(entry)
            cursor = cursors.get(id(template))
            if cursor is None:
                cursor = cursors[id(template)] = Job(*_all_values(template))
            put(cursor, "id", job_id)
            if template.array_index is not None:
                put(cursor, "array_index", template.array_index + job_id)
            if entry is not template:
                changed.add(id(template))
                for name in _DISTINCT:
                    put(cursor, name, getattr(entry, name))
            elif id(template) in changed:
                changed.discard(id(template))
                for name in _DISTINCT:
                    put(cursor, name, getattr(template, name))
            yield cursor


class JobTable(MutableMapping[int, Job]):
    """id -> Job, as a dict, with pending jobs held by their template (Kinds.lean). Reading
    a job builds it; alike() reads the entries as they are held, for what a template
    answers the same as its jobs (all but the id, log paths, array index and pending
    reason)."""

    def __init__(self, kinds: Kinds):
        self.kinds = kinds
        self._entries: dict[int, Job] = {}

    def __getitem__(self, job_id: int) -> Job:
        entry = self._entries[job_id]
        return entry if entry.id else self.kinds.build(job_id, entry)

    @overload
    def get(self, job_id: int, default: None = None) -> Job | None: ...
    @overload
    def get(self, job_id: int, default: Job | _T) -> Job | _T: ...
    def get(self, job_id: int, default: object = None) -> object:
        entry = self._entries.get(job_id)
        if entry is None:
            return default
        return entry if entry.id else self.kinds.build(job_id, entry)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[int]:
        return iter(self._entries)

    def keys(self) -> KeysView[int]:
        return self._entries.keys()

    def __setitem__(self, job_id: int, job: Job) -> None:
        self._entries[job_id] = self.kinds.lean(job)

    def put_lean(self, job_id: int, entry: Job) -> None:
        """Hold an entry that Kinds.lean gave already (for a job put in two tables)."""
        self._entries[job_id] = entry

    def __delitem__(self, job_id: int) -> None:
        del self._entries[job_id]

    @overload
    def pop(self, job_id: int) -> Job: ...
    @overload
    def pop(self, job_id: int, default: Job | _T) -> Job | _T: ...
    def pop(self, job_id: int, default: object = _MISSING) -> object:
        entry = self._entries.pop(job_id, None)  # an entry is never None
        if entry is None:
            if default is _MISSING:
                raise KeyError(job_id)
            return default
        return entry if entry.id else self.kinds.build(job_id, entry)

    def discard(self, job_id: int) -> None:
        """pop() without building what it took out."""
        self._entries.pop(job_id, None)

    def clear(self) -> None:
        self._entries.clear()

    def alike(self) -> Iterable[tuple[int, Job]]:
        """(id, entry) pairs: the job, or its template (see the class)."""
        return self._entries.items()

    def holds(self, job: Job) -> bool:
        """Whether job is the version of it this table holds (a built one: equal to it)."""
        entry = self._entries.get(job.id)
        if entry is None or entry is job:
            return entry is job
        return not entry.id and self.kinds.build(job.id, entry) == job

    def sort(self) -> None:
        """Hold the entries in id order, as a dict filled in id order would."""
        entries = self._entries
        self._entries = {job_id: entries[job_id] for job_id in sorted(entries)}

    def compact(self) -> None:
        """A new dict sized to fit (a dict keeps the size of the most it ever held)."""
        self._entries = dict(self._entries)
