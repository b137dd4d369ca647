"""The queue file's check before anything opens it for writing: tell damage from other failures.

Missing, empty, unreadable, not a regular file, a symlink, a -wal that SQLite would
silently drop, an old or newer schema, tables that do not match their version, a corrupt
file: each is told apart and worded with what to do. What cannot be trusted is refused,
and every file is left byte-identical: nothing is opened for writing, a FIFO is never
opened at all (lstat first), and a queue with a -wal is checked in a private copy, since
even a read-only SQLite connection may rewrite the -shm.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import stat
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gpusched.core.errors import StoreError
from gpusched.proc import runfile
from gpusched.store.walcheck import wal_problem

log = logging.getLogger("gpusched.store.integrity")

SQLITE_MAGIC = b"SQLite format 3\x00"
SIDECARS = ("-wal", "-shm")
# queue.db.created, written once a queue exists: a queue file lost or emptied later is then
# told from a new home even when its jobs never left a file (held jobs, say).
CREATED = ".created"
DOCTOR = "Run `gpusched doctor` to see what can be saved"
REPAIR = "`gpusched doctor --repair` copies it into a new queue and keeps this file"

_KINDS = {
    stat.S_IFDIR: "directory",
    stat.S_IFIFO: "FIFO (named pipe)",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
}


@dataclass(frozen=True)
class Verdict:
    """What the check found. kind: new, ok or old (usable: a new queue, one at this schema,
    one to migrate), else why not: symlink, not_regular, unreadable, earlier_queue, wal,
    corrupt, newer, schema. message: one line for the person; details: for the log."""

    kind: str
    message: str = ""
    version: int = 0
    details: tuple[str, ...] = field(default=())

    @property
    def is_usable(self) -> bool:
        return self.kind in ("new", "ok", "old")


def require_trusted(path: str, migrations: Sequence[str], jobs_dir: str | None = None) -> int:
    """The schema version of a queue file gpusched may open (0: a new one); else StoreError."""
    verdict = inspect(path, migrations, jobs_dir)
    if len(verdict.details) > 1:  # the user's line has the first; the log gets them all
        for line in verdict.details:
            log.error("%s: %s", path, line)
    if not verdict.is_usable:
        raise StoreError(verdict.message)
    return verdict.version


def inspect(
    path: str,
    migrations: Sequence[str],
    jobs_dir: str | None = None,
    integrity: str = "quick_check",
) -> Verdict:
    """Look at the queue file and its sidecars without changing a byte of them."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return _new_queue(path, "is missing", jobs_dir)
    except OSError as exc:
        return Verdict(
            "unreadable",
            f"queue file {path} cannot be looked at ({exc.strerror}); "
            "gpusched left it untouched. Check the permissions of its directory "
            "(`gpusched doctor` tells more).",
        )
    problem = _file_problem(path, info, "queue file")
    for suffix in SIDECARS:
        problem = problem or _sidecar_problem(path + suffix)
    if problem:
        return problem
    if info.st_size == 0:
        return _new_queue(path, "is empty (0 bytes)", jobs_dir)
    header = _read(path, 100) or b""
    if not header.startswith(SQLITE_MAGIC) or len(header) < 100:
        return _corrupt(path, [f"not an SQLite database: it starts with {header[:16]!r}"])
    page_bytes = int.from_bytes(header[16:18], "big")
    problem_words = wal_problem(
        _read(path + "-wal"), _read(path + "-shm"), 65536 if page_bytes == 1 else page_bytes
    )
    if problem_words:
        return Verdict(
            "wal",
            f"queue file {path}: {problem_words}. gpusched left the files "
            "untouched, as opening them would silently drop acknowledged jobs. "
            "Put back the original -wal if you have it; else run `gpusched doctor` "
            f"to see what can be saved; {REPAIR}.",
        )
    return _check_contents(path, migrations, jobs_dir, integrity)


def _file_problem(path: str, info: os.stat_result, what: str) -> Verdict | None:
    if stat.S_ISLNK(info.st_mode):
        target = os.readlink(path)
        dangling = "" if os.path.exists(path) else ", which does not exist"
        return Verdict(
            "symlink",
            f"{what} {path} is a symbolic link (to {target}{dangling}); "
            "gpusched keeps its queue in a regular file and does not follow links. "
            f"Put the file itself at {path}, or remove the link (`gpusched doctor` tells "
            "more).",
        )
    if not stat.S_ISREG(info.st_mode):
        kind = _KINDS.get(stat.S_IFMT(info.st_mode), "special file")
        return Verdict(
            "not_regular",
            f"{what} {path} is a {kind}, not a regular file; gpusched "
            "left it untouched. Move it out of the way (`gpusched doctor` tells more).",
        )
    if not os.access(path, os.R_OK | os.W_OK):
        return Verdict(
            "unreadable",
            f"{what} {path} cannot be read and written by uid "
            f"{os.getuid()} (it belongs to uid {info.st_uid}, mode "
            f"{stat.S_IMODE(info.st_mode):04o}); gpusched left it untouched. The file "
            "may well be intact: do not move it aside, give it back to this user "
            f"(`sudo chown {os.getuid()} {path}`); `gpusched doctor` tells more.",
        )
    return None


def _sidecar_problem(path: str) -> Verdict | None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    problem = _file_problem(path, info, "queue sidecar")
    if problem and problem.kind in ("symlink", "not_regular"):
        # Refused as the queue file itself: SQLite would open it, or hang on a FIFO.
        return Verdict(problem.kind, problem.message)
    return problem


def _read(path: str, limit: int = -1) -> bytes | None:
    """A file's bytes (None: absent). Never follows a link nor waits on a FIFO put in
    place since the lstat: such a file is read as absent here and refused next time."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (FileNotFoundError, OSError):
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return fh.read(limit)


def earlier_jobs(jobs_dir: str | None) -> dict[int, list[str]]:
    """The files of jobs in the jobs directory (ID.run.jsonl, ID.stdout.log, ...), by id."""
    return runfile.job_files(jobs_dir) if jobs_dir else {}


def _new_queue(path: str, how: str, jobs_dir: str | None) -> Verdict:
    """A new queue, unless something says there was one: then ids would be reused."""
    evidence = []
    jobs = earlier_jobs(jobs_dir)
    if jobs:
        evidence.append(
            f"{jobs_dir} holds the files of {len(jobs)} earlier job(s), up to id {max(jobs)}"
        )
    sidecars = [path + suffix for suffix in SIDECARS if os.path.lexists(path + suffix)]
    evidence += [f"{sidecar} is still there" for sidecar in sidecars]
    if os.path.lexists(path + CREATED):
        evidence.append(f"{path}{CREATED} says a queue was made here")
    if not evidence:
        return Verdict("new")
    if jobs:
        risk = "a new queue would give their ids to new jobs"
    elif sidecars:
        risk = "they may hold its jobs"
    else:
        risk = "a new queue would lose its jobs and give their ids again"
    return Verdict(
        "earlier_queue",
        f"queue file {path} {how}, but {' and '.join(evidence)}: "
        f"{risk}. gpusched left everything "
        f"untouched. Put back the queue file if you have it; else run `gpusched "
        "doctor --repair`, which starts a new queue whose ids continue above them.",
    )


def mark_created(path: str) -> None:
    """Note beside a queue just opened that one exists here (once; see CREATED)."""
    marker = path + CREATED
    if os.path.lexists(marker):
        return
    try:
        with open(marker + ".tmp", "w", encoding="utf-8") as out:
            out.write(
                f"a gpusched queue was made here on {time.strftime('%Y-%m-%d %H:%M:%S %z')}\n"
            )
            out.flush()
            os.fsync(out.fileno())
        os.replace(marker + ".tmp", marker)
    except OSError as exc:  # a full disk: the queue works without it, and the next start retries
        log.warning("could not write %s (%s)", marker, exc)


def _corrupt(path: str, lines: list[str]) -> Verdict:
    first = lines[0] if lines else "unknown"
    more = f"{len(lines)} problems, the first: " if len(lines) > 1 else ""
    where = "; all of them are in the daemon's log" if len(lines) > 1 else ""
    return Verdict(
        "corrupt",
        f"queue file {path} is corrupt ({more}{first}{where}); gpusched "
        f"left it untouched. {DOCTOR}; {REPAIR}.",
        details=tuple(lines),
    )


@contextmanager
def reading(path: str, wal: bytes | None = None) -> Iterator[sqlite3.Connection]:
    """A connection that reads the queue (and its -wal) without touching any of its files:
    the file itself, immutable, when it has no sidecar; else a private copy of it.
    wal: read with this log in place of the queue's own."""
    sidecars = [s for s in SIDECARS if os.path.exists(path + s)]
    if not sidecars and wal is None:
        # as_uri-style quoting: a '?' or '#' in the path is not read as URI syntax.
        conn = sqlite3.connect(f"{Path(path).absolute().as_uri()}?immutable=1", uri=True)
        try:
            yield conn
        finally:
            conn.close()
        return
    with tempfile.TemporaryDirectory(prefix="gpusched-check-") as scratch:
        copy = os.path.join(scratch, "queue.db")
        shutil.copyfile(path, copy)
        if wal is not None:
            with open(copy + "-wal", "wb") as fh:
                fh.write(wal)
        elif "-wal" in sidecars:  # not the -shm: SQLite rebuilds the index from the log
            shutil.copyfile(path + "-wal", copy + "-wal")
        conn = sqlite3.connect(copy)
        try:
            yield conn
        finally:
            conn.close()


def expected_columns(migrations: Sequence[str], version: int) -> dict[str, list[str]]:
    """Each table's columns at a schema version, from the migrations themselves."""
    conn = sqlite3.connect(":memory:")
    try:
        for script in migrations[:version]:
            conn.executescript(script)
        return table_columns(conn)
    finally:
        conn.close()


def table_columns(conn: sqlite3.Connection) -> dict[str, list[str]]:
    tables = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    ]
    return {t: [r[1] for r in conn.execute(f'PRAGMA table_info("{t}")')] for t in tables}


def schema_mismatch(have: dict[str, list[str]], want: dict[str, list[str]]) -> str:
    """How the tables differ from those of their schema version, in words; '' if they match."""
    for table, columns in want.items():
        if table not in have:
            return f"table {table} is missing"
        missing = [c for c in columns if c not in have[table]]
        if missing:
            return f"table {table} lacks column(s) {', '.join(missing)}"
    extra = sorted(set(have) - set(want))
    return f"it has table(s) {', '.join(extra)} that version lacks" if extra else ""


def integrity_lines(conn: sqlite3.Connection, pragma: str = "integrity_check") -> list[str]:
    """SQLite's integrity report, one problem a line (["ok"] when there is none); its
    "*** in database main ***" heading left out."""
    lines = [line for (text,) in conn.execute(f"PRAGMA {pragma}") for line in text.splitlines()]
    return [line for line in lines if not line.startswith("*** in database")] or lines


def _trial_migration(conn: sqlite3.Connection, migrations: Sequence[str], version: int) -> str:
    """Why updating an old schema would fail, tried on a copy in memory; '' if it works."""
    if version in (0, len(migrations)):
        return ""
    trial = sqlite3.connect(":memory:")
    try:
        conn.backup(trial)
        for script in migrations[version:]:
            trial.executescript(script)
    except sqlite3.Error as exc:
        return str(exc)
    finally:
        trial.close()
    return ""


def _check_contents(
    path: str, migrations: Sequence[str], jobs_dir: str | None, integrity: str
) -> Verdict:
    try:
        with reading(path) as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > len(migrations):
                return Verdict(
                    "newer",
                    f"queue file {path} has schema version {version}, newer "
                    f"than this gpusched understands ({len(migrations)}); gpusched "
                    "left it untouched. Upgrade gpusched (`gpusched doctor` tells more).",
                    version,
                )
            lines = integrity_lines(conn, integrity)
            have = table_columns(conn)
            failed = _trial_migration(conn, migrations, version) if lines == ["ok"] else ""
    except sqlite3.DatabaseError as exc:
        return _corrupt(path, [str(exc)])
    except OSError as exc:
        return Verdict(
            "unreadable",
            f"queue file {path} could not be copied for a read-only "
            f"check ({exc}); gpusched left it untouched. Free some space in "
            f"{tempfile.gettempdir()} and try again (`gpusched doctor` tells more).",
        )
    if lines != ["ok"]:
        return _corrupt(path, lines)
    mismatch = schema_mismatch(have, expected_columns(migrations, version))
    if mismatch:
        return Verdict(
            "schema",
            f"queue file {path} says schema version {version} but {mismatch}"
            f"; gpusched left it untouched. {DOCTOR}; {REPAIR}.",
            version,
        )
    if failed:
        return Verdict(
            "old_failed",
            f"queue file {path} has the old schema version {version}, "
            f"and updating it failed ({failed}); gpusched left it untouched. "
            f"{DOCTOR}; {REPAIR}.",
            version,
        )
    if version == 0:
        return _new_queue(path, "holds no queue yet", jobs_dir)
    return Verdict("ok" if version == len(migrations) else "old", version=version)
