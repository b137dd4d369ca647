"""Damaged queues, built the way they happen: from a real daemon's home, stopped cleanly or
killed mid-flight, then spoiled one way each. Shared by test_storecheck and test_doctor."""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import Home, wait_until
from gpusched.store.database import SCHEMA_VERSION
from gpusched.store.integrity import expected_columns
from gpusched.store.schema import MIGRATIONS

SUFFIXES = ("", "-wal", "-shm")


def fingerprint(state: Path) -> dict[str, str | None]:
    """sha256 of queue.db, -wal and -shm (or what stands in their place; None: absent)."""
    out: dict[str, str | None] = {}
    for suffix in SUFFIXES:
        path = state / f"queue.db{suffix}"
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            out[suffix] = None
            continue
        if stat.S_ISLNK(info.st_mode):
            out[suffix] = f"link to {os.readlink(path)}"
        elif not stat.S_ISREG(info.st_mode):
            out[suffix] = f"mode {info.st_mode:o}"
        else:
            out[suffix] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def build_homes(home: Home, clean: Path, crashed: Path) -> None:
    """Two copies of a real home's state: `clean` after `daemon stop` (no -wal), and
    `crashed` after a SIGKILL with commits still in the -wal (and its -shm index)."""
    for _ in range(3):
        home.submit("--", "true")
    wait_until(lambda: all(j["state"] == "succeeded" for j in home.jobs()), "jobs to end")
    home.submit("--hold", "--", "true")
    home.run("daemon", "stop")
    shutil.copytree(home.state, clean, symlinks=True)
    home.start()
    for _ in range(3):
        home.submit("--hold", "--", "true")  # commits the killed daemon leaves in its -wal
    home.kill_daemon()
    assert (home.state / "queue.db-wal").stat().st_size > 0
    shutil.copytree(home.state, crashed, symlinks=True)


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """A real daemon's home, stopped cleanly and killed: built once per test module."""
    root = tmp_path_factory.mktemp("bases")
    home = Home(root / "home", "2x80GiB")
    home.write_config()
    try:
        build_homes(home, root / "clean", root / "crashed")
    finally:
        home.cleanup()
    return {"clean": root / "clean", "crashed": root / "crashed"}


def place(base: Path, home: Home) -> Path:
    """A copy of a built state directory as this home's; its path."""
    shutil.copytree(base, home.state, symlinks=True)
    return home.state


def sql(db: Path, *statements: str) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


# -- the variants: (name, base: "clean" or "crashed", spoil(state dir), words of the refusal)
def missing(s: Path) -> None:
    (s / "queue.db").unlink()


def empty(s: Path) -> None:
    (s / "queue.db").write_bytes(b"")


def missing_with_no_job_files(s: Path) -> None:
    """Lost with nothing else of it left but the note that a queue was made here (a queue
    of held jobs leaves no job files)."""
    shutil.rmtree(s / "jobs")
    missing(s)


def empty_with_no_job_files(s: Path) -> None:
    shutil.rmtree(s / "jobs")
    empty(s)


def empty_beside_wal(s: Path) -> None:
    (s / "queue.db").write_bytes(b"")
    shutil.rmtree(s / "jobs")  # only the -wal tells that there was a queue


def dangling_link(s: Path) -> None:
    (s / "queue.db").unlink()
    (s / "queue.db").symlink_to(s / "elsewhere" / "queue.db")


def link_to_queue(s: Path) -> None:
    (s / "queue.db").rename(s / "real.db")
    (s / "queue.db").symlink_to(s / "real.db")


def directory(s: Path) -> None:
    (s / "queue.db").unlink()
    (s / "queue.db").mkdir()


def fifo(s: Path) -> None:
    (s / "queue.db").unlink()
    os.mkfifo(s / "queue.db")


def wal_fifo(s: Path) -> None:
    os.mkfifo(s / "queue.db-wal")


def garbage(s: Path) -> None:
    (s / "queue.db").write_bytes(b"definitely not SQLite\n" * 500)


def bad_header(s: Path) -> None:
    data = bytearray((s / "queue.db").read_bytes())
    data[:16] = b"SQLite format 2\x00"
    (s / "queue.db").write_bytes(bytes(data))


def bad_page(s: Path) -> None:
    # The jobs table's b-tree: overwrite its root page's header.
    conn = sqlite3.connect(s / "queue.db")
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'jobs'").fetchone()[0]
    page = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    data = bytearray((s / "queue.db").read_bytes())
    data[(root - 1) * page : (root - 1) * page + 12] = b"\x0d\xff\xff\x00\x05" + b"\xff" * 7
    (s / "queue.db").write_bytes(bytes(data))


def newer(s: Path) -> None:
    sql(s / "queue.db", "PRAGMA user_version = 99")


def old_that_fails(s: Path) -> None:
    # Says version 3, but version 4's columns are there: the update to 4 cannot apply. The
    # tables later versions added go, or they would be the first complaint.
    later = set(expected_columns(MIGRATIONS, SCHEMA_VERSION)) - set(expected_columns(MIGRATIONS, 3))
    sql(
        s / "queue.db",
        *(f"DROP TABLE {table}" for table in sorted(later)),
        "PRAGMA user_version = 3",
    )


def table_gone(s: Path) -> None:
    sql(s / "queue.db", "DROP TABLE meta")


def wal_deleted(s: Path) -> None:
    (s / "queue.db-wal").unlink()


def wal_cut(s: Path) -> None:
    wal = s / "queue.db-wal"
    wal.write_bytes(wal.read_bytes()[: wal.stat().st_size // 2])


def wal_frame_damaged(s: Path) -> None:
    flip(s / "queue.db-wal", 32 + 24 + 100)  # inside the first frame's page


def wal_bad_header(s: Path) -> None:
    flip(s / "queue.db-wal", 0)


def wal_of_another_queue(s: Path) -> None:
    other = s / "other.db"
    writer = sqlite3.connect(other, isolation_level=None)
    writer.execute("PRAGMA journal_mode = WAL")
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute("CREATE TABLE t (x)")
    writer.execute("INSERT INTO t VALUES (1)")
    data = Path(f"{other}-wal").read_bytes()
    writer.close()
    for suffix in SUFFIXES:
        Path(f"{other}{suffix}").unlink(missing_ok=True)
    (s / "queue.db-wal").write_bytes(data)


VARIANTS: list[tuple[str, str, Callable[[Path], None], str]] = [
    ("missing beside earlier jobs", "clean", missing, "is missing, but"),
    ("empty (0 bytes) beside earlier jobs", "clean", empty, "is empty (0 bytes), but"),
    ("empty beside a -wal", "crashed", empty_beside_wal, "-wal is still there"),
    (
        "missing, no job files left",
        "clean",
        missing_with_no_job_files,
        "queue.db.created says a queue was made here",
    ),
    (
        "empty, no job files left",
        "clean",
        empty_with_no_job_files,
        "queue.db.created says a queue was made here",
    ),
    ("a dangling symlink", "clean", dangling_link, "which does not exist"),
    ("a symlink to a queue", "clean", link_to_queue, "is a symbolic link"),
    ("a directory", "clean", directory, "is a directory, not a regular file"),
    ("a FIFO", "clean", fifo, "is a FIFO (named pipe), not a regular file"),
    ("a FIFO as -wal", "clean", wal_fifo, "queue.db-wal is a FIFO"),
    ("not SQLite", "clean", garbage, "is corrupt (not an SQLite database"),
    ("a spoiled header", "clean", bad_header, "is corrupt (not an SQLite database"),
    ("a spoiled page", "clean", bad_page, "is corrupt ("),
    ("a newer schema", "clean", newer, "has schema version 99, newer than this gpusched"),
    (
        "an old schema that fails to update",
        "clean",
        old_that_fails,
        "has the old schema version 3, and updating it failed (duplicate column name",
    ),
    (
        "a table missing",
        "clean",
        table_gone,
        f"says schema version {SCHEMA_VERSION} but table meta is missing",
    ),
    ("a deleted -wal", "crashed", wal_deleted, "the -wal is missing but the -shm"),
    ("a -wal cut short", "crashed", wal_cut, "it was cut short or damaged"),
    ("a damaged -wal frame", "crashed", wal_frame_damaged, "frame 1 of"),
    ("a spoiled -wal header", "crashed", wal_bad_header, "is not an SQLite WAL header"),
    (
        "another queue's -wal",
        "crashed",
        wal_of_another_queue,
        "is not the log its -shm index describes",
    ),
]
