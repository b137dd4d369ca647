"""Give back to the system the memory a long queue held once it has shrunk.

Python frees a job's objects as soon as it leaves the active set, but the C allocator
keeps the freed pages: after 10,000 queued jobs ran, the daemon stayed twice its idle
size although it held no more jobs than before. glibc's malloc_trim() returns them.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

# A trim is due once the active jobs fell by this many from their high-water mark, and
# to half of it at most: a trim walks the whole heap (a few ms), so not for a few jobs.
TRIM_AFTER_JOBS_GONE = 1000


def libc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


class MemoryTrim:
    """Watches how many jobs are active; once a large drop has settled, compacts and trims."""

    def __init__(self, trim: Callable[[int], int] | None = None):
        self._trim = trim or libc_trim()
        self.high_water = 0
        self._last_count = 0

    def note(self, active_count: int, compact: Callable[[], None]) -> bool:
        """Called once a loop turn: whether it trimmed. compact() rebuilds the state's
        job tables, whose size follows the largest queue they ever held."""
        # Only once the count held still for a turn: not at every step of a long drain,
        # and by then the request that emptied the queue, with all it held, is gone too.
        settled, self._last_count = active_count == self._last_count, active_count
        self.high_water = max(self.high_water, active_count)
        if (
            not settled
            or self.high_water - active_count < TRIM_AFTER_JOBS_GONE
            or active_count * 2 > self.high_water
        ):
            return False
        self.high_water = active_count
        compact()
        if self._trim is not None:
            self._trim(0)
        return True
