"""The store's reads of finished jobs (`ls --all`, `ls --last`, retention, `usage`, memory
estimates) and their removal: part of store/database.py's Store, which provides _conn and
_jobs()."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpusched.core.models import Job, JobState
from gpusched.core.spec.jobname import program_name_of_json

IDS_PER_QUERY = 500  # under SQLite's oldest limit on bound values (999)
# What store/rowusage.py reads of a row.
_USAGE_COLUMNS = "submitted_at, started_at, ended_at, attempt, gpu_uuids, gpu_mem_peak_bytes"
# What `gpusched history` shows of a run (daemon/jobs/gpumemory.py).
_RUN_COLUMNS = "state, started_at, ended_at, attempt, gpu_mem_bytes, gpu_mem_peak_bytes, gpu_uuids"
_FINAL = sorted(state.value for state in JobState if state.is_final)


class FinishedJobs:
    """Mixed into Store: the queries of jobs that ended."""

    _conn: sqlite3.Connection

    if TYPE_CHECKING:  # Store's (store/database.py)

        def _jobs(self, rows: Iterable[sqlite3.Row]) -> list[Job]: ...

    def finished(self, after_id: int, count: int, up_to_id: int = 2**63 - 1) -> list[Job]:
        """Up to `count` finished jobs with ids after `after_id` (up to `up_to_id`: where a
        page of 100,000 pending ones ends, not read to the end), in id order (`ls --all`)."""
        rows = self._conn.execute(
            "SELECT * FROM jobs WHERE id > ? AND id <= ? AND state NOT IN ('pending', 'running') "
            "ORDER BY id LIMIT ?",
            (after_id, up_to_id, count),
        )
        return self._jobs(rows)

    def finished_down_from(self, top_id: int, count: int) -> list[Job]:
        """Up to `count` finished jobs with ids up to `top_id`, newest first (`ls --last`):
        a walk down the primary key that reads only the rows it returns."""
        rows = self._conn.execute(
            "SELECT * FROM jobs WHERE id <= ? AND state NOT IN ('pending', 'running') "
            "ORDER BY id DESC LIMIT ?",
            (top_id, count),
        )
        return self._jobs(rows)

    # -- retention (daemon/jobs/retention.py), usage and estimates ----------------------------
    def finished_extent(self) -> tuple[int, int]:
        """How many finished jobs the queue holds, and the highest id of any job."""
        finals = ",".join("?" * len(_FINAL))
        (count,) = self._conn.execute(
            f"SELECT count(*) FROM jobs WHERE state IN ({finals})", _FINAL
        ).fetchone()
        (last,) = self._conn.execute("SELECT coalesce(max(id), 0) FROM jobs").fetchone()
        return count, last

    def finished_between(self, first_id: int, last_id: int) -> list[sqlite3.Row]:
        """The finished jobs with ids first_id..last_id, in id order: the columns retention
        weighs and sums up (a row, not a Job: a damaged column elsewhere does not matter)."""
        finals = ",".join("?" * len(_FINAL))
        return self._conn.execute(
            f"SELECT id, state, user, {_USAGE_COLUMNS}, cpus, array_id, "
            f"stdout_path, stderr_path, open_mode, pty FROM jobs WHERE id BETWEEN ? AND ? "
            f"AND state IN ({finals}) "
            "ORDER BY id",
            (first_id, last_id, *_FINAL),
        ).fetchall()

    def used_between(
        self, first_id: int, last_id: int, since_s: float, by_name: bool = False
    ) -> list[sqlite3.Row]:
        """Of the jobs with ids first_id..last_id, those that ran or ended at since_s or
        later, and those still pending: the columns `gpusched usage` sums (daemon/observe/usage.py),
        and by_name, the command too (a job's default name is its program's)."""
        return self._conn.execute(
            f"SELECT uid, user, name, {'command, ' if by_name else ''}state, gpu_mem_bytes, "
            f"{_USAGE_COLUMNS} "
            "FROM jobs "
            "WHERE id BETWEEN ? AND ? AND (ended_at IS NULL OR ended_at >= ?)",
            (first_id, last_id, since_s),
        ).fetchall()

    def gpu_peaks(
        self, uid: int, key: str, states: tuple[str, ...], count: int
    ) -> list[sqlite3.Row]:
        """The newest `count` finished runs of a user's job key in these states, newest
        first: what --gpu-mem auto estimates from and `gpusched history` lists (the
        jobs_key index makes it a short walk however large the queue)."""
        marks = ",".join("?" * len(states))
        return self._conn.execute(
            f"SELECT id, name, {_RUN_COLUMNS} FROM jobs WHERE uid = ? AND job_key = ? "
            f"AND state IN ({marks}) ORDER BY id DESC LIMIT ?",
            (uid, key, *states, count),
        ).fetchall()

    def run_seconds(
        self, count: int, uid: int | None = None, key: str | None = None
    ) -> list[float]:
        """How long the newest `count` successful runs lasted, newest first: of a user's
        job key, of a user's jobs, or (uid None) of the box's: what a predicted runtime
        reads (core/sched/runtimes.py). Each is a short walk of an index of successful runs
        only (jobs_runs_key, jobs_runs_user, jobs_runs), however many jobs are pending."""
        where = "state = 'succeeded' AND started_at IS NOT NULL AND ended_at IS NOT NULL"
        args: list[int | str] = []
        if uid is not None:
            where += " AND uid = ?"
            args.append(uid)
        if key is not None:
            where += " AND job_key = ?"
            args.append(key)
        rows = self._conn.execute(
            f"SELECT ended_at - started_at FROM jobs WHERE {where} ORDER BY id DESC LIMIT ?",
            (*args, count),
        )
        return [max(float(seconds), 0.0) for (seconds,) in rows]

    def runs_by_program(
        self, uid: int, name: str, states: tuple[str, ...], top_id: int, window: int
    ) -> tuple[list[sqlite3.Row], int]:
        """Of the `window` rows with the highest ids up to top_id, a user's finished runs
        with no --name whose program is `name` (as `ls` names them, core/spec/jobname.py:
        derived from the command, so jobs stored before are found too) and not filed under
        it already (gpu_peaks finds those), newest first; and the id to read down from
        next (0: none left). A command holds its program's name: SQLite's instr() passes
        over the others without Python reading them."""
        (low,) = self._conn.execute(
            "SELECT coalesce(min(id), 0) FROM (SELECT id FROM jobs WHERE id <= ? "
            "ORDER BY id DESC LIMIT ?)",
            (top_id, window),
        ).fetchone()
        if not low:
            return [], 0
        marks = ",".join("?" * len(states))
        needle = json.dumps(name)[1:-1]  # as the command column holds it (rowencode.py)
        # +uid: read the window by id, not the user's every row by the jobs_key index.
        rows = self._conn.execute(
            f"SELECT id, command, job_key, {_RUN_COLUMNS} FROM jobs WHERE id BETWEEN ? AND ? "
            f"AND +uid = ? AND state IN ({marks}) AND name = '' AND job_key != ? "
            "AND instr(command, ?) > 0 ORDER BY id DESC",
            (low, top_id, uid, *states, name, needle),
        )
        return [row for row in rows if program_name_of_json(row["command"]) == name], low - 1

    def delete_ids(self, ids: list[int]) -> None:
        for start in range(0, len(ids), IDS_PER_QUERY):
            chunk = ids[start : start + IDS_PER_QUERY]
            self._conn.execute(
                f"DELETE FROM jobs WHERE id IN ({','.join('?' * len(chunk))})", chunk
            )
