"""`gpusched doctor --repair`: copy what can be saved of a damaged queue into a new one.

Every row that decodes keeps its id; the id sequence continues above the highest id the
old queue, its damaged rows or the jobs' files ever used, so no id is given out twice.
The old file (and its -wal and -shm) is kept beside the new one, renamed with the time.
Only while no daemon runs: this takes the daemon's lock.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any

from filelock import FileLock, Timeout

from gpusched.client.paths import Paths
from gpusched.core.errors import GpuschedError
from gpusched.core.models import Job
from gpusched.core.sched import reservations
from gpusched.core.sched.reservations import Reservation
from gpusched.core.spec.syntax import MAX_JOB_ID
from gpusched.store import integrity, walcheck
from gpusched.store.database import Store
from gpusched.store.rows import DamagedRow, row_to_job
from gpusched.store.schema import MIGRATIONS

# What --repair does not decide for the user: the check's own message says what to do.
_BY_HAND = ("symlink", "not_regular", "unreadable", "newer")
# What was wrong, in a few words, by the start-up check's kind.
_PROBLEMS = {
    "earlier_queue": "the queue file was missing or empty beside earlier jobs",
    "wal": "its -wal could not be trusted",
    "corrupt": "the queue file was corrupt",
    "schema": "its tables did not match their schema version",
    "old_failed": "its old schema could not be updated",
}


@dataclass
class Repair:
    saved: list[int] = field(default_factory=list)  # ids of the jobs in the new queue
    left_out: dict[int, str] = field(default_factory=dict)  # id -> why it could not be saved
    kept_as: str = ""  # the old queue file's new name ('' when there was none)
    next_id: int = 1
    problem: str = ""  # what was wrong, in a few words
    repaired: bool = False  # False: the queue was healthy, nothing was changed

    def to_dict(self) -> dict[str, Any]:
        return {
            "repaired": self.repaired,
            "problem": self.problem,
            "saved": len(self.saved),
            "saved_ids": self.saved,
            "kept_as": self.kept_as,
            "next_id": self.next_id,
            "left_out": [{"id": i, "reason": r} for i, r in sorted(self.left_out.items())],
        }


def repair(paths: Paths) -> Repair:
    lock = FileLock(paths.lock, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise GpuschedError(
            f"a gpusched daemon runs for {paths.state_dir}; stop it first "
            "(`gpusched daemon stop`), then run `gpusched doctor --repair` "
            "again."
        ) from None
    try:
        return _repair(paths)
    finally:
        lock.release()


def _repair(paths: Paths) -> Repair:
    db = paths.db
    verdict = integrity.inspect(db, MIGRATIONS, paths.jobs_dir)
    if verdict.kind in _BY_HAND:
        raise GpuschedError(f"--repair leaves this to you: {verdict.message}")
    result = Repair(problem=_PROBLEMS.get(verdict.kind, "damaged rows"))
    rows, meta, last_id = _salvage(db, result)
    if verdict.kind == "wal":
        last_id = max(last_id, _ids_only_in_damaged_wal(db, {row["id"] for row in rows}, result))
    jobs = []
    for row in rows:
        try:
            jobs.append(row_to_job(row))
        except DamagedRow as damage:
            result.left_out[damage.job_id] = damage.reason
    if verdict.is_usable and not result.left_out:
        result.saved, result.next_id = [job.id for job in jobs], last_id + 1
        return result  # healthy: nothing to do
    files = integrity.earlier_jobs(paths.jobs_dir)
    last_id = _highest(last_id, *result.left_out, *files)
    _write_queue(db + ".repair", jobs, meta, last_id, _reservations(db))
    result.kept_as = _keep_old(db)
    os.replace(db + ".repair", db)
    _sync_dir(os.path.dirname(db))
    result.saved, result.next_id, result.repaired = [job.id for job in jobs], last_id + 1, True
    return result


def _salvage(db: str, result: Repair) -> tuple[list[sqlite3.Row], list[tuple[str, str]], int]:
    """The rows, meta entries and last id that can be read from the old queue, if any."""
    if not os.path.isfile(db) or os.path.getsize(db) == 0:
        return [], [], 0
    try:
        with integrity.reading(db) as conn:
            conn.row_factory = sqlite3.Row
            last_id = _last_id(conn)
            rows = _rows(conn, last_id, result)
            last_id = _highest(last_id, *(row["id"] for row in rows))
            try:
                meta = [(r[0], r[1]) for r in conn.execute("SELECT key, value FROM meta")]
            except sqlite3.DatabaseError:
                meta = []
            return rows, meta, last_id
    except (sqlite3.DatabaseError, OSError):
        return [], [], 0  # not a database at all: only the jobs' files tell the ids


def _reservations(db: str) -> list[Reservation]:
    """The GPU reservations that can be read from the old queue (none before they existed)."""
    try:
        with integrity.reading(db) as conn:
            rows = conn.execute(
                "SELECT name, gpus, users, start_at, end_at, created_by, created_at "
                "FROM reservations"
            ).fetchall()
    except (sqlite3.DatabaseError, OSError):
        return []
    found = []
    for name, gpus, users, start, end, by, at in rows:
        try:
            found.append(
                reservations.from_dict(
                    {
                        "name": name,
                        "gpus": json.loads(gpus),
                        "users": json.loads(users),
                        "start": start,
                        "end": end,
                        "created_by": by,
                        "created_at": at,
                    }
                )
            )
        except (ValueError, GpuschedError):  # a damaged one: the admin makes it again
            continue
    return found


def _ids_only_in_damaged_wal(db: str, saved: set[int], result: Repair) -> int:
    """The ids of jobs that only the damaged part of the -wal holds: named as lost, and
    never given out again. Their rows are not saved: after damage, a row that decodes may
    still hold a wrong command."""
    wal = walcheck.resummed(_read(db + "-wal"))
    if wal is None:
        return 0
    try:
        with integrity.reading(db, wal) as conn:
            ids = {r[0] for r in conn.execute("SELECT id FROM jobs")}
            last_id = _last_id(conn)
    except sqlite3.DatabaseError:
        return 0
    for job_id in sorted(ids - saved):
        result.left_out[job_id] = "it was only in the damaged part of the -wal"
    return _highest(last_id, *ids)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _highest(*ids: object) -> int:
    """The highest of the ids that a job can have: one past MAX_JOB_ID is damage (a row
    written by hand), and new ids must not follow it."""
    return max(i for i in ids if type(i) is int and i <= MAX_JOB_ID)


def _last_id(conn: sqlite3.Connection) -> int:
    found = 0
    for query in (
        "SELECT seq FROM sqlite_sequence WHERE name = 'jobs' AND seq <= ?",
        "SELECT max(id) FROM jobs WHERE id <= ?",
    ):  # past MAX_JOB_ID: damage
        try:
            row = conn.execute(query, (MAX_JOB_ID,)).fetchone()
            found = max(found, (row[0] or 0) if row else 0)
        except sqlite3.DatabaseError:
            pass
    return found


def _rows(conn: sqlite3.Connection, last_id: int, result: Repair) -> list[sqlite3.Row]:
    """Every row; where the table is damaged, row by row, naming those that fail."""
    try:
        return conn.execute("SELECT * FROM jobs ORDER BY id").fetchall()
    except sqlite3.DatabaseError as exc:
        if "no such table" in str(exc):
            return []
    rows = []
    for job_id in range(1, last_id + 1):
        try:
            row = conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        except sqlite3.DatabaseError as exc:
            result.left_out[job_id] = f"its row cannot be read ({exc})"
            continue
        if row is not None:
            rows.append(row)
    return rows


def _write_queue(
    path: str,
    jobs: list[Job],
    meta: list[tuple[str, str]],
    last_id: int,
    reserved: list[Reservation],
) -> None:
    for suffix in ("", *integrity.SIDECARS):  # left by a repair that was interrupted
        if os.path.lexists(path + suffix):
            os.unlink(path + suffix)
    store = Store(path)
    try:
        with store.write():
            store.insert(jobs)
            for key, value in meta:
                store.set_meta(key, value)
            for reservation in reserved:
                store.put_reservation(reservation)
            store.reserve_ids(last_id)
    finally:
        store.close()


def _keep_old(db: str) -> str:
    """Rename the old queue file and its sidecars with the time; '' if there was none."""
    kept = f"{db}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
    moved = False
    for suffix in ("", *integrity.SIDECARS):
        if os.path.lexists(db + suffix):
            os.rename(db + suffix, kept + suffix)
            moved = True
    return kept if moved else ""


def _sync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
