"""The queue file: WAL and synchronous=FULL, ids never reused, migrations, refusing bad files."""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from gpusched.core.errors import StoreError
from gpusched.core.models import Job, JobState, Request, transition
from gpusched.core.sched.reservations import Reservation
from gpusched.store.database import Store, check_file
from gpusched.store.schema import MIGRATIONS, SCHEMA_VERSION

SIDECARS = ("-wal", "-shm", "-journal")


def new_job(**changes) -> Job:
    values = {
        "id": 0,
        "command": ("python", "train.py"),
        "cwd": "/work",
        "uid": 1000,
        "user": "ada",
        "request": Request(1, 20 * 2**30),
        "name": "train",
        "priority": 3,
        "env": {"A": "1", "B": "x=y"},
        "submitted_at": 1700000000.5,
        "submit_pid": 4321,
    }
    values.update(changes)
    return Job(**values)


def add(store: Store, *jobs: Job) -> list[int]:
    with store.write():
        return store.insert(jobs)


def snapshot(path: Path) -> dict[str, str | None]:
    """sha256 of the queue file and of each SQLite sidecar (None: absent)."""
    out = {}
    for suffix in ("",) + SIDECARS:
        p = Path(f"{path}{suffix}")
        out[suffix or "db"] = hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None
    return out


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "queue.db"


@pytest.fixture
def store(db: Path):
    s = Store(db)
    yield s
    s.close()


def test_wal_and_full_sync(store, db):
    conn = store._conn  # the pragmas are per connection: check the store's own
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    # WAL mode is stored in the file itself, so any reader sees it.
    with sqlite3.connect(db) as other:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_writes_take_the_write_lock_up_front(store, db):
    # BEGIN IMMEDIATE: a second writer is refused at BEGIN, not halfway through.
    with store.write():
        other = sqlite3.connect(db, timeout=0, isolation_level=None)
        try:
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
        finally:
            other.close()


def test_job_round_trips(store):
    (job_id,) = add(store, new_job())
    stored = store.get(job_id)
    assert stored == new_job(id=job_id)
    assert stored.env == {"A": "1", "B": "x=y"}  # env is not part of Job equality
    assert store.get(job_id + 1) is None


def test_running_job_round_trips(store):
    (job_id,) = add(store, new_job())
    job = transition(
        store.get(job_id),
        JobState.RUNNING,
        started_at=1700000001.0,
        gpu_uuids=("GPU-a", "GPU-b"),
        gpu_indices=(2, 3),
        master_port=29501,
        runner_pid=77,
        runner_start_time=1700000000.9,
        boot_id="boot",
    )
    with store.write():
        store.update(job)
    assert store.get(job_id) == job
    assert store.get(job_id).gpu_indices == (2, 3)
    # The columns keep their first names: a queue file of an earlier version reads the same.
    row = store._conn.execute("SELECT shim_pid, shim_start_time FROM jobs WHERE id = ?", (job_id,))
    assert tuple(row.fetchone()) == (77, 1700000000.9)


def test_ids_are_never_reused_even_after_deleting_the_last_row(store, db):
    ids = add(store, new_job(), new_job(), new_job())
    assert ids == sorted(ids) and len(set(ids)) == 3
    with store.write():
        store._conn.execute("DELETE FROM jobs WHERE id = ?", (ids[-1],))
    (after_delete,) = add(store, new_job())
    assert after_delete > ids[-1]
    store.close()
    reopened = Store(db)
    try:
        (after_reopen,) = add(reopened, new_job())
        assert after_reopen > after_delete
    finally:
        reopened.close()


def test_active_and_finished(store):
    a, b, c = add(store, new_job(), new_job(), new_job())
    with store.write():
        store.update(transition(store.get(b), JobState.CANCELLED, ended_at=1.0))
    assert [j.id for j in store.active()] == [a, c]
    assert [j.id for j in store.finished(0, 10)] == [b]


def test_a_failed_write_leaves_nothing(store):
    with pytest.raises(RuntimeError):
        with store.write():
            store.insert([new_job()])
            raise RuntimeError("boom")
    assert store.active() == []


# -- versions and migrations ---------------------------------------------------------------
@pytest.mark.parametrize("how", ["missing", "empty file"])
def test_a_new_queue_is_created_at_the_current_version(db, how):
    if how == "empty file":
        db.write_bytes(b"")
    assert check_file(db) == 0
    Store(db).close()
    assert check_file(db) == SCHEMA_VERSION
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def build_at_version(db: Path, version: int) -> None:
    """A queue file as an older gpusched left it: the first `version` migrations only."""
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    for script in MIGRATIONS[:version]:
        conn.executescript(script)
    conn.execute(f"PRAGMA user_version = {version}")
    if version >= 1:  # a job in the version-1 columns, which every later version keeps
        conn.execute(
            "INSERT INTO jobs (name, state, command, cwd, env, uid, user, gpus, gpu_mem_bytes, "
            "priority, submitted_at) VALUES ('old', 'pending', '[\"true\"]', '/', '{}', 7, 'bob', "
            "1, NULL, 0, 1.0)"
        )
    conn.commit()
    conn.close()


@pytest.mark.parametrize("version", range(SCHEMA_VERSION))
def test_migrates_from_every_older_version(db, version):
    build_at_version(db, version)
    assert check_file(db) == version
    store = Store(db)
    try:
        assert store._conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        if version >= 1:
            (old,) = store.active()
            assert (old.name, old.user, old.command, old.request.gpus) == (
                "old",
                "bob",
                ("true",),
                1,
            )
        (new_id,) = add(store, new_job())
        assert store.get(new_id) == new_job(id=new_id)
    finally:
        store.close()


def test_version_3_jobs_keep_their_cores_as_a_limit_only_when_they_asked(db):
    """Before version 4 every job stored cores, 1 by default: a GPU job with 1 core did
    not ask, so it no longer waits for one; retries get the default delay."""
    build_at_version(db, 3)
    conn = sqlite3.connect(db)
    for gpus, cpus in ((0, 1), (2, 4)):
        conn.execute(
            "INSERT INTO jobs (name, state, command, cwd, env, uid, user, gpus, priority, "
            f"submitted_at, cpus) VALUES ('v3', 'pending', '[\"true\"]', '/', '{{}}', 7, 'bob', "
            f"{gpus}, 0, 1.0, {cpus})"
        )
    conn.commit()
    conn.close()
    store = Store(db)
    try:
        jobs = store.active()
        assert [(j.request.gpus, j.request.cpus, j.request.cpus_required) for j in jobs] == [
            (1, 1, False),
            (0, 1, True),
            (2, 4, True),
        ]
        assert {(j.retry_delay_s, j.eligible_at, j.last_attempt_end) for j in jobs} == {
            (10.0, None, "")
        }
    finally:
        store.close()


def test_a_version_9_queue_opens_with_no_begin_times_and_then_stores_them(db):
    """The queue of the version before --begin: its jobs start as before (no begin time);
    a begin time stored after the migration reads back."""
    build_at_version(db, 9)
    store = Store(db)
    try:
        (old,) = store.active()
        assert old.begin_time is None
        with store.write():
            store.update(replace(old, begin_time=1796349600.5))
        assert store.get(old.id).begin_time == 1796349600.5
    finally:
        store.close()


def test_a_version_13_queue_opens_with_no_reservations_and_then_stores_them(db):
    """The queue of the version before reservations: its jobs are in none; a reservation
    and a job's --reservation stored after the migration read back."""
    build_at_version(db, 13)
    store = Store(db)
    demo = Reservation("demo", (2, 3), ("alice",), 1796349600.5, 1796364000.0, "root", 1.5)
    try:
        (old,) = store.active()
        assert old.reservation == "" and store.reservations() == []
        with store.write():
            store.update(replace(old, reservation="demo"))
            store.put_reservation(demo)
        assert store.get(old.id).reservation == "demo"
        assert store.reservations() == [demo]
        with store.write():
            store.delete_reservation("demo")
        assert store.reservations() == []
    finally:
        store.close()


def test_a_waiting_retry_round_trips(store):
    (job_id,) = add(
        store, new_job(request=Request(1, cpus=0, cpus_required=True), retry_delay_s=2.5)
    )
    job = replace(
        store.get(job_id), attempt=2, eligible_at=1700000100.25, last_attempt_end="timeout"
    )
    with store.write():
        store.update(job)
    assert store.get(job_id) == job
    assert store.get(job_id).request.cpus == 0


# -- refusing bad files, leaving them byte-identical ---------------------------------------
def clean_queue(db: Path) -> None:
    store = Store(db)
    add(store, new_job(), new_job())
    store.close()  # the last connection checkpoints and removes -wal and -shm


def test_clean_close_leaves_no_sidecars(db):
    clean_queue(db)
    assert snapshot(db)["-wal"] is None and snapshot(db)["-shm"] is None


def corrupt_garbage(db: Path) -> None:
    db.write_bytes(b"this is not a database, whatever it once was\n" * 300)


def corrupt_header(db: Path) -> None:
    clean_queue(db)
    data = bytearray(db.read_bytes())
    data[:16] = b"SQLite format 2\x00"
    db.write_bytes(bytes(data))


def corrupt_a_page(db: Path) -> None:
    clean_queue(db)
    data = bytearray(db.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    assert len(data) >= 2 * page
    data[page : 2 * page] = b"\xa5" * page  # the jobs table's root page
    db.write_bytes(bytes(data))


def newer_schema(db: Path) -> None:
    clean_queue(db)
    with sqlite3.connect(db) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()


@pytest.mark.parametrize(
    "spoil, words",
    [
        (corrupt_garbage, "is corrupt"),
        (corrupt_header, "is corrupt"),
        (corrupt_a_page, "is corrupt"),
        (newer_schema, "newer than this gpusched"),
    ],
)
def test_refuses_a_bad_file_and_leaves_it_byte_identical(db, spoil, words):
    spoil(db)
    before = snapshot(db)
    assert before["-wal"] is None and before["-shm"] is None
    with pytest.raises(StoreError) as info:
        Store(db)
    message = info.value.message
    assert words in message and str(db) in message and "\n" not in message
    # Not one byte changed, and no SQLite sidecar appeared beside it.
    assert snapshot(db) == before


def test_newer_schema_left_by_a_crashed_writer_keeps_its_wal(db):
    # A newer gpusched was killed: its last commit is still in the -wal. Refusing must not
    # checkpoint that into the file or change the -wal. (The -shm is SQLite's shared-memory
    # index, which any reader may rebuild; it holds no data.)
    clean_queue(db)
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    # Copy the files while the writer is open: that is what a crash leaves behind.
    kept = {s: Path(f"{db}{s}").read_bytes() for s in ("", "-wal")}
    writer.close()
    for suffix, data in kept.items():
        Path(f"{db}{suffix}").write_bytes(data)
    assert kept["-wal"], "the commit should still be in the -wal"
    before = snapshot(db)
    with pytest.raises(StoreError, match="newer than this gpusched"):
        Store(db)
    after = snapshot(db)
    assert (after["db"], after["-wal"]) == (before["db"], before["-wal"])


def test_jobs_inserted_whole_under_the_ids_next_ids_gave(store):
    first = add(store, new_job())
    with store.write():
        ids = store.next_ids(3)
        assert store.insert([new_job(id=i, stdout_path=f"/logs/{i}") for i in ids]) == ids
    assert ids == [first[0] + 1, first[0] + 2, first[0] + 3]
    assert store.get(ids[2]).stdout_path == f"/logs/{ids[2]}"
    assert add(store, new_job()) == [ids[-1] + 1]  # automatic ids carry on after them


def test_many_fetches_more_jobs_than_one_query_may_name(store):
    ids = add(store, *[new_job(name=f"j{n}") for n in range(1200)])
    found = store.many(ids + [10**9])
    assert sorted(found) == ids and found[ids[-1]].name == "j1199"
    assert len(store.states(ids)) == 1200
