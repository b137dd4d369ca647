"""Telling shims that their job's end is stored, so they need not flush their run file too.

A shim reports its job's end from a socket named for the run (runfile.end_address) and
waits a moment for runfile.STORED; without it, it makes the exit record durable itself
(gpusched/proc/shim.py). The answer goes out only once the end is committed to the queue.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Mapping
from typing import Any

from gpusched.core.models import Job
from gpusched.proc import runfile

# Reports not answered yet (their job's end not stored yet) kept at most: a flood of
# datagrams costs a bounded dict; a shim left unanswered flushes its record itself.
MAX_WAITING = 4096


class EndReports:
    """Reports from the wake socket's thread; answered by the loop's after its commits."""

    def __init__(self) -> None:
        self._incoming: queue.SimpleQueue[tuple[Any, str]] = queue.SimpleQueue()
        self._waiting: dict[Any, str] = {}  # a shim's address -> its run's token

    def report(self, sender: Any) -> str | None:
        """A wake-up's sender: kept if it is a shim reporting its run's end; that run's
        token (None for any other sender)."""
        run = runfile.ended_run(sender)
        if run is not None:
            self._incoming.put((sender, run))
        return run

    def answer(self, active: Mapping[int, Job], send: Callable[[Any, bytes], None]) -> None:
        """STORED to each shim whose run is no longer running here, outside a write: a run
        that ended stays running in `active` until the commit that stores its end."""
        while not self._incoming.empty():
            address, run = self._incoming.get_nowait()
            self._waiting[address] = run
        for address, run in list(self._waiting.items()):
            if not _is_running(active, run):
                del self._waiting[address]
                send(address, runfile.STORED)
        while len(self._waiting) > MAX_WAITING:  # the oldest go unanswered
            del self._waiting[next(iter(self._waiting))]


def _is_running(active: Mapping[int, Job], run: str) -> bool:
    job_id, _, _ = run.partition(".")
    job = active.get(int(job_id)) if job_id.isdigit() else None
    return job is not None and job.is_running and runfile.run_token(job) == run
