"""The queue's WAL checkpoints, off the loop's thread.

SQLite copies the write-ahead log back into the database file (a checkpoint, with an
fsync of that file) in the commit that takes the log past 1,000 pages: on the loop's
thread, in the middle of a turn, tens of milliseconds on a busy disk, and often while a
100,000-job submit is stored. The daemon's connection turns that off (wal_autocheckpoint
= 0) and this thread checkpoints on a connection of its own, which SQLite allows beside
the writer: a PASSIVE checkpoint takes no lock a commit waits for.

Commits are durable in the log (synchronous=FULL) whether it is checkpointed or not; a
checkpoint that fails (a full disk) is tried again after the next commits.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpusched.store.database import Store

log = logging.getLogger("gpusched.store.checkpoints")

# Rows written between checkpoints: about the 1,000 pages of SQLite's own default, for the
# jobs' rows of a few hundred bytes to a few KB.
CHECKPOINT_ROWS = 1000


class Checkpointer:
    """A thread that checkpoints the store's log once CHECKPOINT_ROWS rows were written."""

    def __init__(self, db_path: str):
        self._db_path = db_path
        self._due = threading.Event()
        self._stopping = False
        self._rows_at_last = 0
        self.checkpoints = 0  # done, for tests and the log
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="gpusched-checkpoints", daemon=True)

    def attach(self, store: Store) -> None:
        """Take the store's checkpoints over (store/database.py calls committed() after
        each commit) and start."""
        store.hand_over_checkpoints(self.committed)
        self._thread.start()

    def committed(self, total_rows: int) -> None:
        """On the loop's thread, after a commit: cheap, it only wakes the thread."""
        if total_rows - self._rows_at_last >= CHECKPOINT_ROWS:
            self._rows_at_last = total_rows
            self._due.set()

    def close(self) -> None:
        """Stop the thread (the store's close checkpoints what is left)."""
        self._stopping = True
        self._due.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        conn = sqlite3.connect(self._db_path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA busy_timeout=1000")
            while True:
                self._due.wait()
                self._due.clear()
                if self._stopping:
                    return
                self._checkpoint(conn)
        finally:
            conn.close()

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:
            if not self._failing:  # said once, until one works again
                log.warning(
                    "checkpointing the queue's log failed (%s); tried again after the next writes",
                    exc,
                )
            self._failing = True
            return
        self._failing = False
        self.checkpoints += 1
