"""The damaged queues: (name, what the daemon should do, how to lay the state dir out)."""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

Build = Callable[[Path], None]


def _copy(source: Path, *names: str) -> Build:
    def build(state: Path) -> None:
        for name in names:
            shutil.copy2(source / name, state / name)

    return build


def _bytes(make: Callable[[bytes], bytes], source: Path) -> Build:
    def build(state: Path) -> None:
        (state / "queue.db").write_bytes(make((source / "queue.db").read_bytes()))

    return build


def _sql(source: Path, *statements: str) -> Build:
    """The intact queue with SQL applied to it (a copy: the source stays intact)."""

    def build(state: Path) -> None:
        shutil.copy2(source / "queue.db", state / "queue.db")
        conn = sqlite3.connect(state / "queue.db", isolation_level=None)
        for statement in statements:
            conn.execute(statement)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        for extra in ("queue.db-wal", "queue.db-shm"):
            if (state / extra).exists():
                (state / extra).unlink()

    return build


def _old_schema(state: Path) -> None:
    """A queue as the first version of gpusched wrote it, with one job per GOOD_JOBS name."""
    from gpusched.store.database import MIGRATIONS

    conn = sqlite3.connect(state / "queue.db", isolation_level=None)
    conn.executescript(MIGRATIONS[0])
    for name in ("k0", "k1", "k2"):
        conn.execute(
            "INSERT INTO jobs (name, state, command, cwd, env, uid, user, gpus, "
            "submitted_at) VALUES (?, 'pending', '[\"true\"]', '/', '{}', 0, 'root', "
            "0, 1.0)",
            (name,),
        )
    conn.execute("PRAGMA user_version = 1")
    conn.close()


def build_all(clean: Path, crashed: Path, rng: random.Random) -> list[tuple[str, str, Build]]:
    size = (clean / "queue.db").stat().st_size
    noise = rng.randbytes(size)

    def zero_page(data: bytes) -> bytes:
        page = 4096
        return data[:page] + b"\0" * page + data[2 * page :]

    def dangling(state: Path) -> None:
        # Into a directory that exists: a daemon that follows it creates a queue there.
        (state / "queue.db").symlink_to(state.parent / "elsewhere.db")

    def link(state: Path) -> None:
        shutil.copy2(clean / "queue.db", state.parent / "real.db")
        (state / "queue.db").symlink_to(state.parent / "real.db")

    def corrupt_wal(state: Path) -> None:
        _copy(crashed, "queue.db", "queue.db-wal", "queue.db-shm")(state)
        wal = bytearray((state / "queue.db-wal").read_bytes())
        middle = len(wal) // 2
        wal[middle : middle + 512] = rng.randbytes(512)
        (state / "queue.db-wal").write_bytes(bytes(wal))

    def empty(state: Path) -> None:
        """Emptied, beside the note that a queue was made here (its jobs were all held,
        so no job files are left to tell)."""
        _copy(clean, "queue.db.created")(state)
        (state / "queue.db").write_bytes(b"")

    def shm_only(state: Path) -> None:
        _copy(clean, "queue.db")(state)
        (state / "queue.db-shm").write_bytes(b"\0" * 32768)

    return [
        ("empty", "refuse", empty),
        ("missing", "refuse", _copy(clean, "queue.db.created")),
        ("truncated", "refuse", _bytes(lambda d: d[: len(d) // 2], clean)),
        ("random bytes", "refuse", lambda s: (s / "queue.db").write_bytes(noise)),
        ("garbage header", "refuse", _bytes(lambda d: noise[:100] + d[100:], clean)),
        ("zeroed page", "refuse", _bytes(zero_page, clean)),
        ("directory", "refuse", lambda s: (s / "queue.db").mkdir()),
        ("fifo", "refuse", lambda s: os.mkfifo(s / "queue.db")),
        ("dangling symlink", "refuse", dangling),
        ("symlink", "refuse", link),
        ("unreadable", "refuse", _copy(clean, "queue.db")),
        ("deleted -wal after crash", "refuse", _copy(crashed, "queue.db", "queue.db-shm")),
        ("corrupt -wal", "refuse", corrupt_wal),
        ("-shm without -wal, nothing in it lost", "open", shm_only),
        ("newer schema", "refuse", _sql(clean, "PRAGMA user_version = 99")),
        ("schema version reset", "refuse", _sql(clean, "PRAGMA user_version = 0")),
        (
            "foreign database",
            "refuse",
            _sql(clean, "DROP TABLE jobs", "CREATE TABLE notes (x TEXT)"),
        ),
        ("old schema (v1)", "open", _old_schema),
        (
            "bad row state",
            "quarantine",
            _sql(
                clean,
                "INSERT INTO jobs (name, state, command, "
                "cwd, env, uid, user, gpus, submitted_at) VALUES "
                "('bad', 'bogus', '[\"true\"]', '/', '{}', 0, "
                "'root', 0, 1.0)",
            ),
        ),
        ("bad row JSON (active)", "quarantine", _sql(clean, *_bad_row("pending"))),
        ("bad row JSON (finished)", "quarantine", _sql(clean, *_bad_row("failed"))),
    ]


def _bad_row(state: str) -> tuple[str, ...]:
    """A fourth job, whose command column is not JSON."""
    return (
        f"INSERT INTO jobs (name, state, command, cwd, env, uid, user, gpus, submitted_at) "
        f"VALUES ('bad', '{state}', '[oops', '/', '{{}}', 0, 'root', 0, 1.0)",
    )
