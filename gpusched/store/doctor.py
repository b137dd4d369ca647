"""`gpusched doctor`: check a home (queue file and sidecars, schema, every row, the jobs'
files, permissions) and say in plain lines what is wrong and what to do."""

from __future__ import annotations

import os
import sqlite3
import stat
from dataclasses import asdict, dataclass, field
from typing import Any

from gpusched.client.connection import lock_is_held
from gpusched.client.paths import Paths
from gpusched.core.config import load_settings
from gpusched.core.errors import ConfigError
from gpusched.core.slurm.clusterconf import refuse_in_system_mode
from gpusched.core.spec.syntax import MAX_JOB_ID
from gpusched.proc import runfile
from gpusched.store import integrity
from gpusched.store.rows import DamagedRow, row_to_job
from gpusched.store.schema import MIGRATIONS

OK, NOTE, PROBLEM = "ok", "note", "problem"


@dataclass(frozen=True)
class Finding:
    status: str  # ok, note (worth knowing, not wrong) or problem
    topic: str  # config, home, daemon, queue, rows, jobs
    message: str
    details: tuple[str, ...] = ()


@dataclass
class QueueRows:
    """What the queue's rows hold: the jobs that decode, the ids of the damaged ones."""

    job_states: dict[int, str] = field(default_factory=dict)  # id -> state, of good rows
    started: set[int] = field(default_factory=set)  # ids of jobs that ever started
    damaged: dict[int, str] = field(default_factory=dict)  # id -> what is wrong
    last_id: int = 0  # the highest id ever given (the sequence, or a row above it)
    error: str = ""  # why not every row could be read


@dataclass
class Report:
    state_dir: str
    findings: list[Finding] = field(default_factory=list)
    rows: QueueRows = field(default_factory=QueueRows)

    @property
    def is_healthy(self) -> bool:
        return all(f.status != PROBLEM for f in self.findings)

    def add(self, status: str, topic: str, message: str, details: tuple[str, ...] = ()) -> None:
        self.findings.append(Finding(status, topic, message, details))

    def to_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.is_healthy,
            "state_dir": self.state_dir,
            "findings": [asdict(f) for f in self.findings],
            "jobs": len(self.rows.job_states),
            "last_id": self.rows.last_id,
            "damaged_jobs": [{"id": i, "reason": r} for i, r in sorted(self.rows.damaged.items())],
        }


def read_rows(conn: sqlite3.Connection) -> QueueRows:
    """Every row, decoded as the daemon would; a damaged one is named, not fatal."""
    out = QueueRows()
    conn.row_factory = sqlite3.Row
    try:
        for row in conn.execute("SELECT * FROM jobs ORDER BY id"):
            if row["id"] <= MAX_JOB_ID:  # past it: damaged, and new ids do not follow it
                out.last_id = max(out.last_id, row["id"])
            try:
                job = row_to_job(row)
            except DamagedRow as damage:
                out.damaged[damage.job_id] = damage.reason
                continue
            out.job_states[job.id] = job.state.value
            if job.started_at is not None:
                out.started.add(job.id)
    except sqlite3.DatabaseError as exc:
        out.error = str(exc)
    try:
        seq = conn.execute(
            "SELECT seq FROM sqlite_sequence WHERE name = 'jobs' AND seq <= ?", (MAX_JOB_ID,)
        ).fetchone()
        out.last_id = max(out.last_id, seq[0] if seq else 0)
    except sqlite3.DatabaseError:
        pass
    return out


def diagnose(paths: Paths) -> Report:
    report = Report(paths.state_dir)
    check_config(report, paths)
    if not os.path.isdir(paths.state_dir):
        report.add(
            OK,
            "home",
            f"{paths.state_dir} does not exist yet: the first command "
            "starts a daemon that creates a new queue there",
        )
        return report
    check_dir(report, paths.state_dir, "the state directory")
    running = lock_is_held(paths.lock)
    check_daemon(report, paths, running)
    check_queue(report, paths, running)
    check_dir(report, paths.jobs_dir, "the jobs directory")
    check_job_files(report, paths)
    return report


def check_config(report: Report, paths: Paths) -> None:
    """A config the daemon refuses at start: said here too, since a daemon that will not
    start has no `daemon status` to say it."""
    try:
        settings = load_settings(paths.config_file, environ={})
        if paths.is_system:
            refuse_in_system_mode(settings.clusters, paths.config_file)
    except ConfigError as exc:
        report.add(PROBLEM, "config", f"the daemon refuses to start: {exc.message}")


def check_dir(report: Report, path: str, what: str) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        report.add(
            PROBLEM,
            "home",
            f"{what} {path} is not a directory owned by uid "
            f"{os.getuid()}: move it aside and let gpusched make a new one",
        )
    elif stat.S_IMODE(info.st_mode) & 0o077:
        report.add(
            PROBLEM,
            "home",
            f"{what} {path} is open to others (mode "
            f"{stat.S_IMODE(info.st_mode):04o}): `chmod 700 {path}`",
        )


def check_daemon(report: Report, paths: Paths, running: bool) -> None:
    socket_there = os.path.lexists(paths.socket)
    if running:
        report.add(NOTE, "daemon", "a daemon is running: the queue was read as it is now")
        if socket_there:
            info = os.lstat(paths.socket)
            if info.st_uid != os.getuid() or not stat.S_ISSOCK(info.st_mode):
                report.add(
                    PROBLEM,
                    "daemon",
                    f"{paths.socket} is not a socket of uid "
                    f"{os.getuid()}: clients will refuse it; restart the daemon",
                )
        else:
            report.add(
                PROBLEM,
                "daemon",
                f"a daemon holds the lock but {paths.socket} is gone: `gpusched daemon restart`",
            )
    elif socket_there:
        report.add(
            NOTE,
            "daemon",
            f"no daemon runs; {paths.socket} is left from the last one "
            "(harmless: the next daemon replaces it)",
        )


def check_queue(report: Report, paths: Paths, running: bool) -> None:
    """The queue file as the daemon's start would judge it, then every row."""
    if running:  # its -wal is live: SQLite's own reading is the only right one
        uri = f"file:{paths.db}?mode=ro"
        try:
            conn = sqlite3.connect(uri, uri=True)
            try:
                lines = integrity.integrity_lines(conn)
                rows = read_rows(conn)
            finally:
                conn.close()
        except sqlite3.DatabaseError as exc:
            lines, rows = [str(exc)], QueueRows(error=str(exc))
        if lines != ["ok"]:
            report.add(
                PROBLEM, "queue", f"queue file {paths.db} is corrupt: {lines[0]}", tuple(lines)
            )
        report.rows = rows
    else:
        verdict = integrity.inspect(paths.db, MIGRATIONS, paths.jobs_dir, "integrity_check")
        if verdict.kind == "new":
            report.add(OK, "queue", f"no queue file yet at {paths.db}: the next daemon creates one")
            return
        if not verdict.is_usable:
            report.add(PROBLEM, "queue", verdict.message, verdict.details)
        elif verdict.kind == "old":
            report.add(
                NOTE,
                "queue",
                f"queue file {paths.db} has the old schema version "
                f"{verdict.version}: the next daemon updates it",
            )
        if verdict.kind in ("symlink", "not_regular", "unreadable", "newer", "earlier_queue"):
            return  # nothing more can be read, or should be
        try:
            with integrity.reading(paths.db) as conn:
                report.rows = read_rows(conn)
        except (sqlite3.DatabaseError, OSError) as exc:
            report.rows = QueueRows(error=str(exc))
    describe_rows(report, paths)


def describe_rows(report: Report, paths: Paths) -> None:
    rows = report.rows
    if rows.error:
        report.add(
            PROBLEM,
            "rows",
            f"not every row could be read ({rows.error}); "
            "`gpusched doctor --repair` saves those that can be",
        )
    for job_id, reason in sorted(rows.damaged.items()):
        report.add(
            PROBLEM,
            "rows",
            f"job {job_id} is damaged ({reason}): the daemon skips it "
            "and never runs it; `gpusched doctor --repair` leaves it out of a new queue",
        )
    states: dict[str, int] = {}
    for state in rows.job_states.values():
        states[state] = states.get(state, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "no jobs"
    report.add(
        OK,
        "queue",
        f"queue file {paths.db}: {len(rows.job_states)} readable job(s) "
        f"({summary}); the next id is {rows.last_id + 1}",
    )


def check_job_files(report: Report, paths: Paths) -> None:
    rows = report.rows
    files = integrity.earlier_jobs(paths.jobs_dir)
    known = rows.job_states.keys() | rows.damaged.keys()
    above = sorted(i for i in files if i > rows.last_id)
    if above:
        report.add(
            PROBLEM,
            "jobs",
            f"{paths.jobs_dir} holds files of job(s) "
            f"{_ids(above)} above the queue's last id {rows.last_id}: new jobs would be "
            "given these ids; `gpusched doctor --repair` starts ids above them",
        )
    orphans = sorted(i for i in files if i <= rows.last_id and i not in known)
    if orphans:
        report.add(
            NOTE,
            "jobs",
            f"{paths.jobs_dir} holds files of job(s) {_ids(orphans)} that "
            "the queue no longer has (kept logs; safe to delete)",
        )
    running = [i for i, s in rows.job_states.items() if s == "running"]
    lost = sorted(
        i for i in running if not os.path.exists(runfile.run_file_found(paths.jobs_dir, i))
    )
    if lost:
        report.add(
            PROBLEM,
            "jobs",
            f"running job(s) {_ids(lost)} have no run file in "
            f"{paths.jobs_dir}: the daemon cannot find their processes and will mark "
            "them lost",
        )
    if files and not (above or orphans or lost):
        report.add(OK, "jobs", f"{paths.jobs_dir}: files of {len(files)} job(s), each in the queue")


def _ids(ids: list[int], shown: int = 10) -> str:
    text = ", ".join(map(str, ids[:shown]))
    return text + (f" and {len(ids) - shown} more" if len(ids) > shown else "")
