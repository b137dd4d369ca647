"""The durable job queue: SQLite in WAL mode, one writer (the daemon), versioned schema."""

from __future__ import annotations

import json
import sqlite3
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Iterable, Iterator

from gpusched.errors import StoreError
from gpusched.models import Job, JobState, Request

SCHEMA_VERSION = 1

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
]
assert len(MIGRATIONS) == SCHEMA_VERSION

_JSON_COLUMNS = {"command", "env", "gpu_uuids", "gpu_indices"}
_JOB_FIELDS = [f.name for f in fields(Job) if f.name != "request"]


def _row_to_job(row: sqlite3.Row) -> Job:
    values = {key: row[key] for key in row.keys()}
    for key in _JSON_COLUMNS:
        values[key] = json.loads(values[key])
    values["command"] = tuple(values["command"])
    values["gpu_uuids"] = tuple(values["gpu_uuids"])
    values["gpu_indices"] = tuple(values["gpu_indices"])
    values["state"] = JobState(values["state"])
    values["cancel_requested"] = bool(values["cancel_requested"])
    values["request"] = Request(values.pop("gpus"), values.pop("gpu_mem_bytes"))
    return Job(**values)


def _job_to_row(job: Job) -> dict:
    row = {name: getattr(job, name) for name in _JOB_FIELDS}
    row["gpus"], row["gpu_mem_bytes"] = job.request.gpus, job.request.gpu_mem_bytes
    row["state"] = job.state.value
    for key in _JSON_COLUMNS:
        row[key] = json.dumps(list(row[key]) if key != "env" else row[key])
    return row


def check_file(path: Path) -> int:
    """Read-only check before anything writes: the schema version of an intact queue file.

    Opening read-only first means a corrupt or newer file is left byte-identical.
    """
    if not path.exists() or path.stat().st_size == 0:
        return 0
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
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

    def __init__(self, path: Path):
        version = check_file(path)
        self.path = path
        # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so every write takes
        # the write lock up front instead of failing halfway through a transaction.
        self._conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
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
        """One write transaction; everything inside commits together or not at all."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def insert(self, jobs: Iterable[Job]) -> list[int]:
        """Add new jobs (their id is ignored) and return the ids the queue gave them."""
        ids = []
        for job in jobs:
            row = _job_to_row(job)
            row.pop("id")
            cols = ", ".join(row)
            marks = ", ".join(f":{c}" for c in row)
            cur = self._conn.execute(f"INSERT INTO jobs ({cols}) VALUES ({marks})", row)
            ids.append(cur.lastrowid)
        return ids

    def update(self, job: Job) -> None:
        row = _job_to_row(job)
        sets = ", ".join(f"{c} = :{c}" for c in row if c != "id")
        self._conn.execute(f"UPDATE jobs SET {sets} WHERE id = :id", row)

    def get(self, job_id: int) -> Job | None:
        row = self._conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _row_to_job(row) if row else None

    def active(self) -> list[Job]:
        """Pending and running jobs, in id order."""
        rows = self._conn.execute(
            "SELECT * FROM jobs WHERE state IN ('pending', 'running') ORDER BY id")
        return [_row_to_job(r) for r in rows]

    def finished(self, limit: int) -> list[Job]:
        """The most recently submitted finished jobs, oldest first."""
        rows = self._conn.execute(
            "SELECT * FROM jobs WHERE state NOT IN ('pending', 'running') "
            "ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return [_row_to_job(r) for r in reversed(rows)]

    def close(self) -> None:
        self._conn.close()
