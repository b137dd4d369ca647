"""The durable job queue: SQLite in WAL mode, one writer (the daemon), versioned schema."""

from __future__ import annotations

import json
import sqlite3
from contextlib import contextmanager
from dataclasses import asdict, fields
from pathlib import Path
from typing import Iterable, Iterator

from gpusched.core.errors import StoreError
from gpusched.core.models import Constraints, Job, JobState, Request

SCHEMA_VERSION = 4

# Migrations[n] takes a database at version n to n + 1. Version 0 is an empty file.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,  -- AUTOINCREMENT: ids are never reused
        name TEXT NOT NULL DEFAULT '',
        state TEXT NOT NULL,
        command TEXT NOT NULL,
        cwd TEXT NOT NULL,
        env TEXT NOT NULL,
        uid INTEGER NOT NULL,
        user TEXT NOT NULL,
        submit_pid INTEGER,
        gpus INTEGER NOT NULL,
        gpu_mem_bytes INTEGER,
        priority INTEGER NOT NULL DEFAULT 0,
        submitted_at REAL NOT NULL,
        started_at REAL,
        ended_at REAL,
        exit_code INTEGER,
        signal INTEGER,
        gpu_uuids TEXT NOT NULL DEFAULT '[]',
        gpu_indices TEXT NOT NULL DEFAULT '[]',
        pending_reason TEXT NOT NULL DEFAULT '',
        master_port INTEGER,
        shim_pid INTEGER,
        shim_start_time REAL,
        boot_id TEXT NOT NULL DEFAULT '',
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        stdout_path TEXT NOT NULL DEFAULT '',
        stderr_path TEXT NOT NULL DEFAULT '',
        end_reason TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX jobs_active ON jobs(state) WHERE state IN ('pending', 'running');
    """,
    # 2: scheduling semantics (hold, dependencies, arrays, time limits, retries, policy,
    # GPU constraints) and a key/value table for queue-wide state such as draining.
    """
    ALTER TABLE jobs ADD COLUMN held INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN dependencies TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE jobs ADD COLUMN kill_on_invalid_dep INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN array_id INTEGER;
    ALTER TABLE jobs ADD COLUMN array_index INTEGER;
    ALTER TABLE jobs ADD COLUMN array_throttle INTEGER;
    ALTER TABLE jobs ADD COLUMN time_limit_s REAL;
    ALTER TABLE jobs ADD COLUMN warn_signal INTEGER;
    ALTER TABLE jobs ADD COLUMN warn_before_s REAL NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN warned INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN timed_out INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN retries INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN retry_on TEXT NOT NULL DEFAULT '["failed"]';
    ALTER TABLE jobs ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE jobs ADD COLUMN policy TEXT NOT NULL DEFAULT '';
    ALTER TABLE jobs ADD COLUMN constraints TEXT NOT NULL DEFAULT '{}';
    CREATE INDEX jobs_array ON jobs(array_id) WHERE array_id IS NOT NULL;
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    """,
    # 3: host resources (CPUs, host memory) and observed peaks.
    """
    ALTER TABLE jobs ADD COLUMN cpus INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE jobs ADD COLUMN mem_bytes INTEGER;
    ALTER TABLE jobs ADD COLUMN cpu_ids TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE jobs ADD COLUMN mem_peak_bytes INTEGER;
    ALTER TABLE jobs ADD COLUMN gpu_mem_peak_bytes INTEGER;
    ALTER TABLE jobs ADD COLUMN mem_over INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN oom_killed INTEGER NOT NULL DEFAULT 0;
    """,
    # 4: cores as a limit only when asked for (a GPU job stored with the old default of
    # one core did not ask), and a delay before each retry. (Fair-share usage lives in meta.)
    """
    ALTER TABLE jobs ADD COLUMN cpus_required INTEGER NOT NULL DEFAULT 1;
    UPDATE jobs SET cpus_required = 0 WHERE cpus = 1 AND gpus > 0;
    ALTER TABLE jobs ADD COLUMN retry_delay_s REAL NOT NULL DEFAULT 10;
    ALTER TABLE jobs ADD COLUMN eligible_at REAL;
    ALTER TABLE jobs ADD COLUMN last_attempt_end TEXT NOT NULL DEFAULT '';
    """,
]
assert len(MIGRATIONS) == SCHEMA_VERSION

# Columns stored as JSON, and whether their value is a tuple in the Job.
_JSON_TUPLES = {"command": True, "env": False, "gpu_uuids": True, "gpu_indices": True,
                "dependencies": True, "retry_on": True, "cpu_ids": True}
_BOOLEANS = ("cancel_requested", "held", "kill_on_invalid_dep", "warned", "timed_out",
             "mem_over", "oom_killed")
_JOB_FIELDS = [f.name for f in fields(Job) if f.name != "request"]


def _constraints_from_json(text: str) -> Constraints:
    data = json.loads(text)
    for key in ("gpu_ids", "exclude_gpus", "min_compute_capability"):
        if data.get(key) is not None:
            data[key] = tuple(data[key])
    return Constraints(**data)


def _row_to_job(row: sqlite3.Row) -> Job:
    values = {key: row[key] for key in row.keys()}
    for key, is_tuple in _JSON_TUPLES.items():
        value = json.loads(values[key])
        values[key] = tuple(tuple(v) if isinstance(v, list) else v for v in value) \
            if is_tuple else value
    for key in _BOOLEANS:
        values[key] = bool(values[key])
    values["state"] = JobState(values["state"])
    values["request"] = Request(values.pop("gpus"), values.pop("gpu_mem_bytes"),
                                _constraints_from_json(values.pop("constraints")),
                                values.pop("cpus"), values.pop("mem_bytes"),
                                bool(values.pop("cpus_required")))
    return Job(**values)


_IDS_PER_QUERY = 500  # under SQLite's oldest limit on bound values (999)

# Fixed at submit: an update need not rewrite (nor re-encode) them, the environment above
# all. The request (GPUs, memory, constraints, CPUs) is fixed too, and stored apart.
_SET_AT_SUBMIT = frozenset({"command", "env", "cwd", "uid", "user", "submit_pid", "submitted_at",
                            "dependencies", "retry_on", "retry_delay_s"})
_UPDATED_FIELDS = [n for n in _JOB_FIELDS if n not in _SET_AT_SUBMIT]


def _job_to_row(job: Job, for_update: bool = False) -> dict:
    """The job's columns; for_update: only those that can change after submit (every
    start and end updates a job, so this runs several times per job)."""
    row = {name: getattr(job, name) for name in (_UPDATED_FIELDS if for_update else _JOB_FIELDS)}
    if not for_update:
        row["gpus"], row["gpu_mem_bytes"] = job.request.gpus, job.request.gpu_mem_bytes
        row["cpus"], row["mem_bytes"] = job.request.cpus, job.request.mem_bytes
        row["cpus_required"] = job.request.cpus_required
        row["constraints"] = json.dumps(asdict(job.request.constraints))
    row["state"] = job.state.value
    for key, is_tuple in _JSON_TUPLES.items():
        if key in row:
            row[key] = json.dumps(list(row[key]) if is_tuple else row[key])
    return row


def check_file(path: str | Path) -> int:
    """Read-only check before anything writes: the schema version of an intact queue file.

    Opening read-only first means a corrupt or newer file is left byte-identical.
    """
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return 0
    # A read-only open of a WAL file creates -wal and -shm beside it and leaves them there.
    # Without a -wal the file is all there is (and the daemon lock keeps writers out), so
    # open it as immutable: nothing is created. A -wal left by a crash must be read, as is.
    mode = "mode=ro" if Path(f"{path}-wal").exists() else "immutable=1"
    try:
        # as_uri() percent-encodes the path, so a '?' or '#' in it is not read as URI syntax.
        conn = sqlite3.connect(f"{path.absolute().as_uri()}?{mode}", uri=True)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            result = conn.execute("PRAGMA quick_check").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"queue file {path} is corrupt ({exc}); gpusched left it untouched. "
                         "Move it aside to start with an empty queue.") from None
    if result != "ok":
        raise StoreError(f"queue file {path} is corrupt ({result}); gpusched left it untouched. "
                         "Move it aside to start with an empty queue.")
    if version > SCHEMA_VERSION:
        raise StoreError(f"queue file {path} has schema version {version}, newer than this "
                         f"gpusched understands ({SCHEMA_VERSION}); upgrade gpusched.")
    return version


class Store:
    """All reads and writes of the queue. Only the daemon opens it for writing."""

    def __init__(self, path: str | Path):
        path = Path(path)
        version = check_file(path)
        self.path = path
        # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so every write takes
        # the write lock up front instead of failing halfway through a transaction.
        self._conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        self._depth = 0  # nesting of write() calls
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute("PRAGMA busy_timeout=5000")
        self._migrate(version)

    def _migrate(self, version: int) -> None:
        for target in range(version, SCHEMA_VERSION):
            with self.write():
                for statement in filter(str.strip, MIGRATIONS[target].split(";")):
                    self._conn.execute(statement)
                self._conn.execute(f"PRAGMA user_version = {target + 1}")

    @contextmanager
    def write(self) -> Iterator[None]:
        """One write transaction; everything inside commits together or not at all.

        Nested uses join the outer transaction, so the daemon's loop can gather a whole
        pass (ends, limits, starts) into one commit: one fsync instead of one per step.
        """
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self._conn.execute("BEGIN IMMEDIATE")
        self._depth = 1
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        else:
            self._conn.execute("COMMIT")
        finally:
            self._depth = 0

    def insert(self, jobs: Iterable[Job]) -> list[int]:
        """Add new jobs and return their ids: a job's own id if it has one (from next_ids),
        the next free one if its id is 0."""
        ids = []
        for job in jobs:
            row = _job_to_row(job)
            if not job.id:
                row.pop("id")
            cols = ", ".join(row)
            marks = ", ".join(f":{c}" for c in row)
            cur = self._conn.execute(f"INSERT INTO jobs ({cols}) VALUES ({marks})", row)
            ids.append(cur.lastrowid)
        return ids

    def next_ids(self, count: int) -> list[int]:
        """The ids the next `count` new jobs get, so that a job is inserted whole, in one
        write (inside a write transaction: no other writer can take them meanwhile)."""
        (last,) = self._conn.execute(
            "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'jobs'), 0), "
            "coalesce((SELECT max(id) FROM jobs), 0))").fetchone()
        return list(range(last + 1, last + 1 + count))

    def update(self, job: Job) -> None:
        """Store what can change after submit; the rest stays as inserted."""
        row = _job_to_row(job, for_update=True)
        sets = ", ".join(f"{c} = :{c}" for c in row if c != "id")
        self._conn.execute(f"UPDATE jobs SET {sets} WHERE id = :id", row)

    def get(self, job_id: int) -> Job | None:
        row = self._conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _row_to_job(row) if row else None

    def many(self, ids: Iterable[int]) -> dict[int, Job]:
        """The jobs with these ids that exist."""
        return {row["id"]: _row_to_job(row) for row in self._rows_by_id("*", ids)}

    def _rows_by_id(self, columns: str, ids: Iterable[int]) -> Iterator[sqlite3.Row]:
        ids = list(ids)
        for start in range(0, len(ids), _IDS_PER_QUERY):  # one query per few hundred
            chunk = ids[start:start + _IDS_PER_QUERY]
            marks = ",".join("?" * len(chunk))
            yield from self._conn.execute(f"SELECT {columns} FROM jobs WHERE id IN ({marks})",
                                          chunk)

    def active(self) -> list[Job]:
        """Pending and running jobs, in id order."""
        rows = self._conn.execute(
            "SELECT * FROM jobs WHERE state IN ('pending', 'running') ORDER BY id")
        return [_row_to_job(r) for r in rows]

    def finished(self, after_id: int, count: int) -> list[Job]:
        """Up to `count` finished jobs with ids after `after_id`, in id order (a page of `ls --all`)."""
        rows = self._conn.execute(
            "SELECT * FROM jobs WHERE id > ? AND state NOT IN ('pending', 'running') "
            "ORDER BY id LIMIT ?", (after_id, count))
        return [_row_to_job(r) for r in rows]

    def array(self, array_id: int) -> list[Job]:
        rows = self._conn.execute("SELECT * FROM jobs WHERE array_id = ? ORDER BY id", (array_id,))
        return [_row_to_job(r) for r in rows]

    def get_meta(self, key: str, default: str = "") -> str:
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def set_meta(self, key: str, value: str) -> None:
        self._conn.execute("INSERT INTO meta (key, value) VALUES (?, ?) "
                           "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value))

    def states(self, ids: Iterable[int]) -> dict[int, JobState]:
        """The state of each given job that exists (for dependencies on finished jobs)."""
        return {row[0]: JobState(row[1]) for row in self._rows_by_id("id, state", ids)}

    def array_ids(self, array_id: int) -> list[int]:
        rows = self._conn.execute("SELECT id FROM jobs WHERE array_id = ? ORDER BY id",
                                  (array_id,))
        return [row[0] for row in rows]

    # -- submits done in batches (daemon/batches.py) ------------------------------------
    def reserve_ids(self, last_id: int) -> None:
        """No later job gets an id up to last_id, even before rows with them exist:
        sqlite_sequence is AUTOINCREMENT's own counter, which SQLite lets us raise."""
        raised = self._conn.execute("UPDATE sqlite_sequence SET seq = max(seq, ?) "
                                    "WHERE name = 'jobs'", (last_id,)).rowcount
        if not raised:
            self._conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('jobs', ?)",
                               (last_id,))

    def meta_starting(self, prefix: str) -> dict[str, str]:
        rows = self._conn.execute("SELECT key, value FROM meta WHERE substr(key, 1, ?) = ?",
                                  (len(prefix), prefix))
        return {key: value for key, value in rows}

    def delete_meta(self, key: str) -> None:
        self._conn.execute("DELETE FROM meta WHERE key = ?", (key,))

    def delete_jobs(self, first_id: int, last_id: int) -> None:
        """Remove the rows of a submit that never completed; their ids stay used."""
        self._conn.execute("DELETE FROM jobs WHERE id BETWEEN ? AND ?", (first_id, last_id))

    def close(self) -> None:
        self._conn.close()
