"""Writes to the queue that fail: SQLite's errors in words, and the daemon's episodes of
failing writes (said once in the log, retried with a backoff, shown by status and ls)."""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path
from typing import Any, TypeGuard

from gpusched.core.errors import StoreWriteError

log = logging.getLogger("gpusched.daemon.writes")
# The loop retries its own writes this long after a failure, doubling up to the most.
FIRST_RETRY_S, MAX_RETRY_S = 1.0, 10.0


def is_write_failure(exc: BaseException) -> TypeGuard[sqlite3.Error]:
    """An error of the database or its disk, not of the statement (a bug: IntegrityError,
    ProgrammingError stay what they are)."""
    return type(exc) in (sqlite3.OperationalError, sqlite3.DatabaseError)


def write_error(exc: sqlite3.Error, db_path: Path) -> StoreWriteError:
    """A failed write in words: what happened and what to do."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    where = db_path.parent
    if name.startswith("SQLITE_IOERR") and _disk_is_full(where):
        name = "SQLITE_FULL"  # some writes (an fsync) report a full disk as an I/O error
    if name.startswith("SQLITE_FULL"):
        return StoreWriteError(
            f"the disk is full ({exc})", f"Free space on the filesystem of {where}"
        )
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return StoreWriteError(
            f"the queue is locked by another process ({exc})",
            f"Close what holds {db_path} open for writing (an sqlite3 "
            "shell, a backup) and try again",
        )
    if name.startswith("SQLITE_READONLY"):
        return StoreWriteError(
            f"the queue file is read-only ({exc})",
            f"Let the daemon's user write {db_path} and {where}",
        )
    if name.startswith("SQLITE_IOERR"):
        return StoreWriteError(
            f"an I/O error ({exc})", f"Check the disk that holds {where} (`dmesg` may say more)"
        )
    return StoreWriteError(
        f"{exc} ({name or type(exc).__name__})", "See the daemon's log and `gpusched daemon status`"
    )


def _disk_is_full(directory: Path) -> bool:
    try:
        return os.statvfs(directory).f_bavail == 0
    except OSError:
        return False


class WriteHealth:
    """Whether the queue's writes work. An episode runs from a failed write to the next
    one that commits; it is logged when it begins (and if its cause changes) and when it
    ends, never once per pass. Meanwhile the loop retries its own writes with a backoff."""

    def __init__(self, clock: Any):
        self.clock = clock  # time() for people, monotonic() for the backoff
        self.failure: StoreWriteError | None = None
        self.since: float | None = None  # when the episode began (epoch s)
        self._retry_delay_s = FIRST_RETRY_S
        self._retry_at = 0.0  # monotonic

    @property
    def failing(self) -> bool:
        return self.failure is not None

    def failed(self, error: StoreWriteError) -> None:
        if self.failure is None:
            self.since = self.clock.time()
            self._retry_delay_s = FIRST_RETRY_S
            self._retry_at = self.clock.monotonic() + self._retry_delay_s
        if self.failure is None or self.failure.cause != error.cause:
            log.error(
                "writes to the queue fail: %s. %s. Requests that change the queue are "
                "refused; reads are answered, and the daemon retries its own writes "
                "(starts, ends) until one commits.",
                error.cause,
                error.remedy,
            )
        self.failure = error

    def worked(self) -> None:
        if self.failure is not None:
            log.warning(
                "writes to the queue work again, after %.0f s of failing (%s)",
                self.clock.time() - (self.since or 0.0),
                self.failure.cause,
            )
        self.failure, self.since = None, None

    def retry_due(self) -> bool:
        """Whether the loop may try its writes now: always, unless they failed lately."""
        if self.failure is None:
            return True
        now = self.clock.monotonic()
        if now < self._retry_at:
            return False
        self._retry_delay_s = min(self._retry_delay_s * 2, MAX_RETRY_S)
        self._retry_at = now + self._retry_delay_s
        return True

    def to_dict(self) -> dict[str, Any] | None:
        """For `daemon status` and `ls`: None while writes work."""
        if self.failure is None:
            return None
        return {"cause": self.failure.cause, "remedy": self.failure.remedy, "since": self.since}
