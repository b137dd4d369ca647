"""The queue's WAL checkpoints are not the loop's (issue 23): the daemon's connection
commits without checkpointing, and a thread of its own copies the log back into the
queue file once enough rows were written. A real SQLite store in a temporary directory."""

from __future__ import annotations

import os

import pytest

from conftest import wait_until
from gpusched.core.models import Job
from gpusched.store.database import Store

ROWS = 3000  # three times what the thread waits for


@pytest.fixture
def store(tmp_path):
    opened = Store(tmp_path / "queue.db")
    yield opened
    opened.close()


def write_rows(store: Store, count: int, per_commit: int = 200) -> None:
    job = Job(id=0, command=("echo", "x" * 500), cwd="/", uid=os.getuid(), user="me")
    for _ in range(count // per_commit):
        with store.write():
            store.insert([job] * per_commit)


def test_the_loops_commits_never_checkpoint_once_handed_over(store):
    told: list[int] = []
    store.hand_over_checkpoints(told.append)
    size = os.path.getsize(store.path)
    write_rows(store, ROWS)
    assert os.path.getsize(store.path) == size  # every page still in the log
    assert told and told[-1] >= ROWS  # each commit said how much was written


def test_the_checkpoint_thread_copies_the_log_into_the_queue_file(store):
    from gpusched.store.checkpoints import Checkpointer

    helper = Checkpointer(str(store.path))
    helper.attach(store)
    try:
        size = os.path.getsize(store.path)
        write_rows(store, ROWS)
        wait_until(lambda: helper.checkpoints >= 1, "a checkpoint by the thread")
        wait_until(lambda: os.path.getsize(store.path) > size, "the queue file to grow")
    finally:
        helper.close()
    assert store.get(1) is not None  # the store goes on as before
