"""A thread per cluster that runs its Slurm commands, so that the daemon's loop never waits
on Slurm: with slurmctld unreachable, one squeue takes about 18 s to give up."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("gpusched.daemon.slurm.worker")

# then(result, error): run on the loop's thread once the work is done; error is the
# exception the work raised (None when it returned).
Then = Callable[[Any, "BaseException | None"], None]


class SlurmWorker:
    """Runs work in order on its own thread; the loop collects what is done with drain()."""

    def __init__(self, name: str, wake: Callable[[], None]):
        self._tasks: queue.Queue[tuple[Callable[[], Any], Then]] = queue.Queue()
        self._done: queue.Queue[tuple[Then, Any, BaseException | None]] = queue.Queue()
        self._wake = wake
        self.pending = 0  # handed to the thread, not collected yet (loop thread only)
        threading.Thread(target=self._serve, name=f"slurm-{name}", daemon=True).start()

    def run(self, work: Callable[[], Any], then: Then) -> None:
        """Do work() on the thread; then() follows on the loop's thread (drain)."""
        self.pending += 1
        self._tasks.put((work, then))

    def _serve(self) -> None:
        while True:
            work, then = self._tasks.get()
            try:
                result, error = work(), None
            except Exception as exc:
                result, error = None, exc
            self._done.put((then, result, error))
            self._wake()

    def drain(self) -> None:
        """The follow-ups of all work done so far, on the calling (loop) thread."""
        while True:
            try:
                then, result, error = self._done.get_nowait()
            except queue.Empty:
                return
            self.pending -= 1
            try:
                then(result, error)
            except Exception:
                log.exception("a Slurm follow-up failed")
