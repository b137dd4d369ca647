"""Retention: finished jobs past [jobs] keep_finished and keep_finished_count are removed
with their files, a little per turn of the loop; their usage stays in a summary.

What goes: finished jobs that ended longer than keep_finished ago, and beyond
keep_finished_count the oldest (lowest ids) of the rest. What stays, however old: a
finished job that an active job depends on (its dependent would never learn how it
ended), and every element of an array that still has active elements (the array is shown
and cancelled as one). Fair share is untouched: its usage lives apart (fairshare.py).

A sweep walks the ids from the lowest up, WINDOW_IDS at a time, for about TURN_BUDGET_S
a turn (daemon/requests/batches.py), so that 100,000 removals never stall the loop: it commits the
rows' removal and the summary together, and only then removes the files (a failed commit
loses nothing). What active jobs still need (daemon/jobs/stillneeded.py) is learnt a chunk of
them per turn, not by a look at all of them each turn. `gpusched gc` runs one sweep now;
the daemon runs one at start and every SWEEP_INTERVAL_S.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from contextlib import nullcontext
from typing import Any

from gpusched.core.errors import StoreWriteError
from gpusched.daemon.jobs.stillneeded import Needed
from gpusched.daemon.requests.batches import TURN_BUDGET_S, Batched
from gpusched.daemon.state import DaemonState, Setup
from gpusched.proc import runfile
from gpusched.store.database import Store
from gpusched.store.rowusage import row_usage

log = logging.getLogger("gpusched.daemon.jobs.retention")

SUMMARY_KEY = "removed_jobs"  # meta: usage of the jobs removed, by user and final state
SWEEP_INTERVAL_S = 600.0
WINDOW_IDS = 500  # ids one query looks at (a window of the primary key: no full scan)
WINDOWS_PER_TURN = 8  # at most this many a turn, even on a fast machine: a turn stays short
# Jobs removed in one turn at most: the commit, and their files after it, come on top of
# the time the windows took.
REMOVALS_PER_TURN = 250


class Sweep(Batched):
    """One pass over the finished jobs: removes (dry_run: only counts) those the settings
    no longer keep. step() returns the report once the pass is done (else None)."""

    def __init__(self, state: DaemonState, setup: Setup, dry_run: bool = False):
        self.state, self.setup, self.dry_run = state, setup, dry_run
        settings = setup.settings
        finished, self._last_id = state.store.finished_extent()
        count = settings.keep_finished_count
        self._excess = max(0, finished - count) if count else 0
        keep_s = settings.keep_finished_s
        self._cutoff = None if keep_s is None else setup.clock.time() - keep_s
        self._next_id = 1
        self.needed = Needed(state)  # started with the sweep's first turn
        self.oldest_kept_ended_at: float | None = None  # of the finished jobs left
        self.report: dict[str, Any] = {
            "dry_run": dry_run,
            "jobs": 0,
            "bytes": 0,
            "oldest_ended_at": None,
            "newest_ended_at": None,
            "kept_for_dependents": 0,
            "keep_finished_s": keep_s,
            "keep_finished_count": count,
        }

    def step(self) -> dict[str, Any] | None:
        try:
            report = self._step()
        except BaseException:
            self.needed.stop()
            raise
        if report is not None:
            self.needed.stop()
        return report

    def abandon(self) -> None:
        self.needed.stop()

    def _step(self) -> dict[str, Any] | None:
        if self.state.incoming:
            return None  # a submit being stored may depend on a job this would remove
        if not self.needed.watching:
            self.needed.start()
        if not self.needed.catch_up():
            return None  # nothing goes before the index knows every active job's needs
        store = self.state.store
        # The machine's own clock, as batches.py: a turn's length is real time.
        deadline, windows = time.monotonic() + TURN_BUDGET_S, WINDOWS_PER_TURN
        keep = self.needed.depended_on, self.needed.busy_arrays
        chosen: list[sqlite3.Row] = []
        with (
            nullcontext()
            if self.dry_run
            else self.state.write(undone="no finished job was removed")
        ):
            while (
                self._next_id <= self._last_id
                and windows
                and len(chosen) < REMOVALS_PER_TURN
                and time.monotonic() < deadline
            ):
                windows -= 1
                # No more ids than may still go this turn: each is at most one removal.
                ids = min(WINDOW_IDS, REMOVALS_PER_TURN - len(chosen))
                rows = store.finished_between(self._next_id, self._next_id + ids - 1)
                self._next_id += ids
                chosen += [row for row in rows if self._goes(row, keep)]
            if chosen and not self.dry_run:
                store.delete_ids([row["id"] for row in chosen])
                store.set_meta(
                    SUMMARY_KEY, json.dumps(add_to_summary(removed_summary(store), chosen))
                )
        self._count(chosen)  # committed: now the files may go
        if self._next_id <= self._last_id:
            return None
        return {**self.report, "removed_so_far": removed_summary(store)}

    def can_skip(self, oldest_kept_ended_at: float | None) -> bool:
        """Whether nothing can be old enough to go: no finished job past the count, and
        the oldest one an earlier pass left still inside keep_finished."""
        return (
            self._excess == 0
            and oldest_kept_ended_at is not None
            and (self._cutoff is None or self._cutoff < oldest_kept_ended_at)
        )

    def _goes(self, row: sqlite3.Row, keep: tuple[set[int], set[int]]) -> bool:
        ended = row["ended_at"]
        old = self._excess > 0 or (
            self._cutoff is not None and ended is not None and ended < self._cutoff
        )
        depended_on, busy_arrays = keep
        if old and (row["id"] in depended_on or row["array_id"] in busy_arrays):
            self.report["kept_for_dependents"] += 1
            old = False
        if not old:
            if ended is not None and (
                self.oldest_kept_ended_at is None or ended < self.oldest_kept_ended_at
            ):
                self.oldest_kept_ended_at = ended
            return False
        self._excess -= 1
        return True

    def _count(self, rows: list[sqlite3.Row]) -> None:
        report, paths = self.report, self.setup.paths
        files = [path for row in rows for path in job_files(paths.jobs_dir, paths.log_root, row)]
        report["bytes"] += remove_files(files, really=not self.dry_run)
        ended = [row["ended_at"] for row in rows if row["ended_at"] is not None]
        for key, pick in (("oldest_ended_at", min), ("newest_ended_at", max)):
            earlier = [] if report[key] is None else [report[key]]
            report[key] = pick(ended + earlier) if ended or earlier else None
        report["jobs"] += len(rows)
        if rows and not self.dry_run:
            _remove_empty_dirs(paths.jobs_dir, {row["id"] for row in rows})


# -- the summary ------------------------------------------------------------------------------


def load_summary(text: str) -> dict[str, Any]:
    """The usage of removed jobs: {"jobs": N, "by_user": {user: {state: {"jobs", "run_s",
    "gpu_s", "core_s"}}}}; empty when none was removed (or the entry is unreadable)."""
    try:
        summary = json.loads(text) if text else {}
    except ValueError:
        log.warning("starting a new summary of removed jobs: the stored one is unreadable")
        summary = {}
    if not isinstance(summary, dict) or not isinstance(summary.get("by_user"), dict):
        return {"jobs": 0, "by_user": {}}
    return summary


def removed_summary(store: Store) -> dict[str, Any]:
    """The usage of every job retention removed, for `daemon status` and `gc`."""
    return load_summary(store.get_meta(SUMMARY_KEY))


def add_to_summary(summary: dict[str, Any], rows: list[sqlite3.Row]) -> dict[str, Any]:
    """Add removed rows to the summary: per user and final state, jobs and sums of what
    store/rowusage.py measures (the sums an older daemon wrote lack the newer keys)."""
    for row in rows:
        used = row_usage(row)
        sums = (
            summary["by_user"]
            .setdefault(row["user"], {})
            .setdefault(row["state"], {"jobs": 0, "run_s": 0.0, "gpu_s": 0.0, "core_s": 0.0})
        )
        sums["jobs"] += 1
        sums["run_s"] += used["run_s"]
        sums["gpu_s"] += used["gpu_s"]
        sums["core_s"] += used["run_s"] * (row["cpus"] or 0)
        sums["mem_byte_s"] = sums.get("mem_byte_s", 0.0) + used["mem_byte_s"]
        if used["wait_s"] >= 0:
            sums["waited"] = sums.get("waited", 0) + 1
            sums["wait_s"] = sums.get("wait_s", 0.0) + used["wait_s"]
        summary["jobs"] = summary.get("jobs", 0) + 1
    return summary


# -- the files --------------------------------------------------------------------------------


def job_files(jobs_dir: str, log_root: str | None, row: sqlite3.Row) -> list[str]:
    """A finished job's files that gpusched made: run file, logs, progress file, and the
    socket of a --pty job's terminal (left behind when its shim was killed). A path
    outside the jobs directory and the log root is never gpusched's to remove, nor are
    the user's --output and --error files (a job with an open_mode has some), wherever
    they are: Slurm never removes them either."""
    own_roots = [root.rstrip(os.sep) + os.sep for root in (jobs_dir, log_root) if root]
    own_logs = runfile.own_log_paths(jobs_dir, log_root, row["user"], row["id"])
    paths = [runfile.run_file_found(jobs_dir, row["id"])]
    for path in (row["stdout_path"], row["stderr_path"]):
        if path and (not row["open_mode"] or path in own_logs):
            paths.append(path)
    if row["stdout_path"]:
        paths.append(
            runfile.progress_path(
                own_logs[0] if row["open_mode"] else row["stdout_path"], row["id"]
            )
        )
    if row["pty"]:
        paths.append(runfile.pty_socket_path(own_logs[0], row["id"]))
    return [path for path in dict.fromkeys(paths) if path.startswith(tuple(own_roots))]


def remove_files(paths: list[str], really: bool = True) -> int:
    """Their size in bytes, removing them (really) through their directories opened
    without following links, each once: in system mode a user's log directory is the
    user's own, and whatever the user puts there, root removes nothing outside it."""
    by_folder: dict[str, list[str]] = {}
    for path in paths:
        folder, name = os.path.split(path)
        by_folder.setdefault(folder, []).append(name)
    freed = 0
    for folder, names in by_folder.items():
        try:
            dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            for name in names:
                try:
                    freed += os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_size
                    if really:
                        os.unlink(name, dir_fd=dir_fd)
                except OSError:
                    pass  # gone already, or not ours to remove
        finally:
            os.close(dir_fd)
    return freed


def _remove_empty_dirs(jobs_dir: str, ids: set[int]) -> None:
    """The id-range directories these jobs emptied (a shim remakes one it needs)."""
    for folder in {runfile.job_dir(jobs_dir, job_id) for job_id in ids}:
        try:
            os.rmdir(folder)
        except OSError:
            pass  # not empty: other jobs' files are there


def gc_request(
    state: DaemonState, setup: Setup, creds: tuple[int, int, int], dry_run: bool
) -> Sweep:
    """`gpusched gc [--dry-run]`: a sweep now, answered when done (admins only in system
    mode; in user mode the daemon's user is its admin)."""
    setup.authz.require_admin(
        creds, "gc", "see what gc would remove" if dry_run else "remove finished jobs"
    )
    return Sweep(state, setup, dry_run=dry_run)


# -- the daemon's own sweeps ------------------------------------------------------------------


class Retention:
    """Starts a sweep at start-up and every SWEEP_INTERVAL_S, and steps it once a turn."""

    def __init__(self, state: DaemonState, setup: Setup):
        self.state, self.setup = state, setup
        self._sweep: Sweep | None = None
        self._due = setup.clock.monotonic()
        # The oldest end among the finished jobs the last whole pass kept: until it is
        # past keep_finished (or the count is), a pass would only read, and is skipped.
        self._oldest_kept: float | None = None
        settings = setup.settings
        self.enabled = settings.keep_finished_s is not None or settings.keep_finished_count > 0

    def _start(self) -> Sweep | None:
        """A pass, when one is due and could remove anything."""
        if self.setup.clock.monotonic() < self._due:
            return None
        self._due = self.setup.clock.monotonic() + SWEEP_INTERVAL_S
        sweep = Sweep(self.state, self.setup)
        if sweep.can_skip(self._oldest_kept):
            return None
        self._sweep = sweep
        return sweep

    @property
    def busy(self) -> bool:
        """A sweep is under way: the loop should come back at once, not sleep."""
        return self._sweep is not None

    def step(self) -> None:
        if not self.enabled or self.state.writes.failing:
            return
        try:
            sweep = self._sweep if self._sweep is not None else self._start()
            if sweep is None:
                return
            report = sweep.step()
        except StoreWriteError:
            self._sweep = None  # said in the log (WriteHealth); tried again when next due
            return
        except Exception:
            log.exception(
                "removing old finished jobs failed; tried again in %g s", SWEEP_INTERVAL_S
            )
            self._sweep = None
            return
        if report is not None:
            self._oldest_kept, self._sweep = sweep.oldest_kept_ended_at, None
            if report["jobs"]:
                log.info(
                    "removed %d finished job(s) and %d bytes of their files",
                    report["jobs"],
                    report["bytes"],
                )
