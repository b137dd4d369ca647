"""The durable job queue: SQLite in WAL mode, one writer (the daemon), versioned schema."""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from operator import attrgetter
from pathlib import Path

from gpusched.core.errors import GpuschedError, StoreError
from gpusched.core.models import Job, JobState
from gpusched.core.spec.syntax import MAX_JOB_ID
from gpusched.store import integrity
from gpusched.store.history import IDS_PER_QUERY, FinishedJobs
from gpusched.store.rowencode import PER_JOB_FIELDS, job_to_row, same_value, sql_literal
from gpusched.store.rows import STATES, DamagedRow, RowDecoder, Shared, row_to_job
from gpusched.store.schema import MIGRATIONS, SCHEMA_VERSION
from gpusched.store.writefail import is_write_failure, write_error

log = logging.getLogger("gpusched.store.database")


def check_file(path: str | Path, jobs_dir: str | None = None) -> int:
    """Read-only check before anything writes: the schema version of a queue file gpusched
    may open (0: a new queue); StoreError, leaving every file byte-identical, if not."""
    return integrity.require_trusted(str(path), MIGRATIONS, jobs_dir)


class Store(FinishedJobs):
    """All reads and writes of the queue. Only the daemon opens it for writing."""

    def __init__(self, path: str | Path, jobs_dir: str | None = None):
        """jobs_dir: where the jobs' files are, so that a missing queue file beside them is
        taken for damage, not for a new queue (their ids would be given out again)."""
        path = Path(path)
        version = check_file(path, jobs_dir)
        self.path = path
        self.damaged: dict[int, str] = {}  # quarantined rows: id -> what is wrong
        # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so every write takes
        # the write lock up front instead of failing halfway through a transaction.
        self._conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        self._depth = 0  # nesting of write() calls
        self._committed: Callable[[int], None] | None = None  # store/checkpoints.py
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute("PRAGMA busy_timeout=5000")
        try:
            self._migrate(version)
        except StoreError:
            self._conn.close()
            raise
        integrity.mark_created(str(path))
        self._find_bad_states()

    def _migrate(self, version: int) -> None:
        for target in range(version, SCHEMA_VERSION):
            try:
                with self.write():
                    for statement in filter(str.strip, MIGRATIONS[target].split(";")):
                        self._conn.execute(statement)
                    self._conn.execute(f"PRAGMA user_version = {target + 1}")
            except sqlite3.Error as exc:  # rolled back: the file is as it was
                raise StoreError(
                    f"queue file {self.path} has the old schema version {target}, and updating "
                    f"it to version {target + 1} failed ({exc}); gpusched rolled the update "
                    f"back. {integrity.DOCTOR}; {integrity.REPAIR}."
                ) from None

    @contextmanager
    def write(self) -> Iterator[None]:
        """One write transaction; everything inside commits together or not at all.

        Nested uses join the outer transaction, so the daemon's loop can gather a whole
        pass (ends, limits, starts) into one commit: one fsync instead of one per step.
        A write that fails (the disk is full, the lock is held elsewhere) is rolled back
        and raised as StoreWriteError, in words for the person who asked.
        """
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise write_error(exc, self.path) from None
        self._depth = 1
        try:
            yield
            self._conn.execute("COMMIT")
        except BaseException as exc:
            self._roll_back()
            if is_write_failure(exc):
                raise write_error(exc, self.path) from None
            raise
        finally:
            self._depth = 0
        if self._committed is not None:
            self._committed(self._conn.total_changes)

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """Inside write(): a part that fails alone. What it wrote is rolled back and the
        transaction goes on (submits arriving together share one commit: daemon/loop.py).
        A write failure is left to the outer write, which rolls everything back."""
        self._conn.execute("SAVEPOINT part")
        try:
            yield
        except BaseException as exc:
            if not is_write_failure(exc) and self._conn.in_transaction:
                self._conn.execute("ROLLBACK TO part")
                self._conn.execute("RELEASE part")
            raise
        self._conn.execute("RELEASE part")

    def _roll_back(self) -> None:
        # SQLite rolls back by itself after some errors (a full disk, an I/O error); after
        # others (a busy COMMIT) the transaction is still open and must be ended here.
        if self._conn.in_transaction:
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # nothing was committed either way

    def hand_over_checkpoints(self, committed: Callable[[int], None]) -> None:
        """No checkpoint in this connection's commits: committed(rows written so far) is
        told of each, and checkpoints on a connection of its own (store/checkpoints.py)."""
        self._conn.execute("PRAGMA wal_autocheckpoint=0")
        self._committed = committed

    @property
    def total_changes(self) -> int:
        """Rows written since the store opened: whether a transaction wrote anything."""
        return self._conn.total_changes

    def insert(self, jobs: Iterable[Job]) -> list[int]:
        """Add new jobs and return their ids: a job's own id if it has one (from next_ids),
        the next free one if its id is 0."""
        ids: list[int] = []
        for job in jobs:
            row = job_to_row(job)
            if not job.id:
                row.pop("id")
            cols = ", ".join(row)
            marks = ", ".join(f":{c}" for c in row)
            cur = self._conn.execute(f"INSERT INTO jobs ({cols}) VALUES ({marks})", row)
            assert cur.lastrowid is not None  # an INSERT into a rowid table sets it
            ids.append(cur.lastrowid)
        return ids

    def insert_alike(self, template: Job, jobs: Sequence[Job]) -> None:
        """Add new jobs, each with its id, made from one template (a sweep's lines, an
        array's elements): they differ from it only in PER_JOB_FIELDS. The template's row
        is encoded once, without the columns it leaves at their defaults (most of them, for
        a new job), and each job's few own columns put in, all in one executemany:
        encoding and binding every row whole took most of a 100,000-job submit's time."""
        base = job_to_row(template)
        defaults = self._column_defaults()
        columns = [
            name
            for name, value in base.items()
            if name in PER_JOB_FIELDS
            or name not in defaults
            or not same_value(value, defaults[name])
        ]
        slots = [(columns.index(name), name) for name in PER_JOB_FIELDS]
        command_at = columns.index("command")
        fixed = [base[name] for name in columns]
        rows = []
        for job in jobs:
            row = fixed.copy()
            for at, name in slots:
                row[at] = getattr(job, name)
            row[command_at] = json.dumps(list(job.command))
            rows.append(row)
        marks = ", ".join("?" * len(columns))
        self._conn.executemany(f"INSERT INTO jobs ({', '.join(columns)}) VALUES ({marks})", rows)

    _defaults: dict[str, object] | None = None

    def _column_defaults(self) -> dict[str, object]:
        """Each column of jobs that has a default, with it (NULL for a nullable column
        without one), as the schema says."""
        if self._defaults is None:
            defaults: dict[str, object] = {}
            for _, name, _, not_null, default, _ in self._conn.execute("PRAGMA table_info(jobs)"):
                if default is not None:
                    defaults[name] = sql_literal(default)
                elif not not_null:
                    defaults[name] = None
            self._defaults = defaults
        return self._defaults

    # The highest id next_ids has handed out: a transaction that handed it out and then
    # failed does not give it back, so no later job has an id a refused one had.
    _last_id_given = 0

    def next_ids(self, count: int) -> list[int]:
        """The ids the next `count` new jobs get, so that a job is inserted whole, in one
        write (inside a write transaction: no other writer can take them meanwhile)."""
        # A row past MAX_JOB_ID is damaged (quarantined), and so is the count SQLite moved
        # up to it when it was written: new ids follow neither.
        (last,) = self._conn.execute(
            "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'jobs' "
            "AND seq <= ?1), 0), coalesce((SELECT max(id) FROM jobs WHERE id <= ?1), 0))",
            (MAX_JOB_ID,),
        ).fetchone()
        first = max(last, self._last_id_given) + 1
        if first + count - 1 > MAX_JOB_ID:
            raise GpuschedError(
                f"the queue has no job ids left: the next is {first:,}, and "
                f"{MAX_JOB_ID:,} is the largest; nothing was queued. Run "
                "`gpusched doctor`"
            )
        self._last_id_given = first + count - 1
        return list(range(first, first + count))

    def reserve_ids(self, last_id: int) -> None:
        """Never give out an id up to last_id, even before rows with them exist (a repaired
        queue carries on the old one's ids; a submit stored in batches reserves its own)."""
        self._conn.execute(
            "INSERT OR IGNORE INTO sqlite_sequence (name, seq) "
            "SELECT 'jobs', 0 WHERE NOT EXISTS "
            "(SELECT 1 FROM sqlite_sequence WHERE name = 'jobs')"
        )
        self._conn.execute(
            "UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = 'jobs'", (last_id,)
        )

    def update(self, job: Job) -> None:
        """Store what can change after submit; the rest stays as inserted."""
        row = job_to_row(job, for_update=True)
        sets = ", ".join(f"{c} = :{c}" for c in row if c != "id")
        self._conn.execute(f"UPDATE jobs SET {sets} WHERE id = :id", row)

    # -- reading: a row that does not decode is quarantined, never fatal -----------------
    def _jobs(self, rows: Iterable[sqlite3.Row]) -> list[Job]:
        """The rows that decode, as jobs; the others are quarantined and left out."""
        jobs, shared = [], Shared()  # what rows hold alike, decoded once and shared
        for row in rows:
            try:
                jobs.append(row_to_job(row, shared))
            except DamagedRow as damage:
                self.quarantine(damage.job_id, damage.reason)
        return jobs

    def quarantine(self, job_id: int, reason: str) -> None:
        """Remember a damaged row (for `daemon status`) and log it once."""
        if job_id not in self.damaged:
            self.damaged[job_id] = reason
            log.warning(
                "job %s in %s is damaged (%s): it is skipped and never run; "
                "`gpusched doctor` tells more",
                job_id,
                self.path,
                reason,
            )

    def _find_bad_states(self) -> None:
        # Cheap in SQL, and such a row is in neither the active set nor a state's listing.
        marks = ",".join("?" * len(STATES))
        for job_id, state in self._conn.execute(
            f"SELECT id, state FROM jobs WHERE state NOT IN ({marks}) OR state IS NULL", STATES
        ):
            self.quarantine(job_id, f"state {state!r} is not a job state")

    def get(self, job_id: int) -> Job | None:
        """The job with this id, None if there is none; StoreError if its row is damaged."""
        row = self._conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            return None
        try:
            return row_to_job(row)
        except DamagedRow as damage:
            self.quarantine(damage.job_id, damage.reason)
            raise StoreError(
                f"job {job_id} is damaged in the queue ({damage.reason}); gpusched "
                "skips it and never runs it. Run `gpusched doctor` to see what "
                "can be saved."
            ) from None

    def many(self, ids: Iterable[int]) -> dict[int, Job]:
        """The jobs with these ids that exist (damaged ones left out)."""
        return {job.id: job for job in self._jobs(self._rows_by_id("*", ids))}

    def _rows_by_id(self, columns: str, ids: Iterable[int]) -> Iterator[sqlite3.Row]:
        ids = list(ids)
        for start in range(0, len(ids), IDS_PER_QUERY):  # one query per few hundred
            chunk = ids[start : start + IDS_PER_QUERY]
            marks = ",".join("?" * len(chunk))
            yield from self._conn.execute(
                f"SELECT {columns} FROM jobs WHERE id IN ({marks})", chunk
            )

    def active(self) -> list[Job]:
        """Pending and running jobs, in id order."""
        return sorted(self.each_active(), key=attrgetter("id"))

    def each_active(self) -> Iterator[Job]:
        """Pending and running jobs, one at a time (pending first; each state in id order):
        maybe 100,000 of a sweep, read as tuples and made jobs by a RowDecoder, which
        decodes each kind of row once. A daemon holds each as it comes (daemon/jobs/jobtable.py),
        never all whole at once."""
        cursor = self._conn.cursor()
        cursor.row_factory = None
        # In the order the state index gives them (by state, then id), sorted here: SQLite's
        # ORDER BY would take as long again as the reading.
        cursor.execute("SELECT * FROM jobs WHERE state IN ('pending', 'running')")
        decoder = RowDecoder([column[0] for column in cursor.description])
        for row in cursor:
            try:
                job = decoder.job(row)
            except DamagedRow as damage:
                self.quarantine(damage.job_id, damage.reason)
                continue
            yield job

    def array(self, array_id: int) -> list[Job]:
        rows = self._conn.execute("SELECT * FROM jobs WHERE array_id = ? ORDER BY id", (array_id,))
        return self._jobs(rows)

    def get_meta(self, key: str, default: str = "") -> str:
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def set_meta(self, key: str, value: str) -> None:
        self._conn.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    def states(self, ids: Iterable[int]) -> dict[int, JobState]:
        """The state of each given job that exists (for dependencies on finished jobs)."""
        return {
            row[0]: JobState(row[1])
            for row in self._rows_by_id("id, state", ids)
            if row[1] in STATES
        }  # a damaged one is as unknown

    def array_ids(self, array_id: int) -> list[int]:
        rows = self._conn.execute("SELECT id FROM jobs WHERE array_id = ? ORDER BY id", (array_id,))
        return [row[0] for row in rows]

    # -- submits done in batches (daemon/requests/batches.py) ------------------------------------
    def meta_starting(self, prefix: str) -> dict[str, str]:
        rows = self._conn.execute(
            "SELECT key, value FROM meta WHERE substr(key, 1, ?) = ?", (len(prefix), prefix)
        )
        return dict(rows)

    def delete_meta(self, key: str) -> None:
        self._conn.execute("DELETE FROM meta WHERE key = ?", (key,))

    def delete_jobs(self, first_id: int, last_id: int) -> None:
        """Remove the rows of a submit that never completed; their ids stay used."""
        self._conn.execute("DELETE FROM jobs WHERE id BETWEEN ? AND ?", (first_id, last_id))

    def close(self) -> None:
        self._conn.close()
