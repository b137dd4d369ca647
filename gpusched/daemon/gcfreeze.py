"""The cyclic garbage collector around big requests: what a big submit makes (100,000 jobs)
is looked at once, a turn's worth at a time, then left out of the collector's scans until
most of those jobs have gone.

A collection walks every object of the generations it collects. Collecting nothing while a
big request's batches ran left all it made to the first collection after it: one scan of
100,000 jobs, 100 to 250 ms of one turn on a loaded machine, and then a full scan of them
again. Instead each turn of a big request collects that turn's young objects (its garbage
cycles are freed as before; a few ms) and moves what survives to the collector's permanent
generation (gc.freeze, O(1)). Jobs that go are still freed at once (reference counts), but
a cycle among frozen objects would wait: once the active jobs are down to a quarter of
what they were when frozen (or to a few thousand), everything goes back to the collector
(gc.unfreeze), whose next full scan then walks what is left. So nothing is kept for ever.

A restart that reads 100,000 pending jobs back is held the same way: no collection while it
reads (each full one walked every job read so far), one of what it made, and a freeze.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

THAW_FRACTION = 4  # unfreeze once the active jobs are this many times fewer than when frozen
# or this few, whatever they were: a full scan of them takes a few ms (and a big request
# that failed, or a big cancel, leaves nothing worth keeping out of the scans).
THAW_JOBS = 2000


class CollectorHold:
    """Told by the loop after each turn of a big request (its collector off meanwhile), and
    after each turn with none."""

    def __init__(self) -> None:
        self.frozen_with_jobs = 0  # active jobs at the last freeze; 0: nothing frozen

    def after_batch(self, active_jobs: int) -> None:
        """This turn's young objects collected (since the last freeze, gen 0 holds only
        them: a few ms), the survivors frozen."""
        gc.collect(0)
        gc.freeze()
        self.frozen_with_jobs = max(self.frozen_with_jobs, active_jobs, 1)

    def idle(self, active_jobs: int) -> None:
        """No big request left: the collector on, and what was frozen back to it once
        most of those jobs have gone."""
        gc.enable()
        if self.frozen_with_jobs and active_jobs <= max(
            THAW_JOBS, self.frozen_with_jobs // THAW_FRACTION
        ):
            gc.unfreeze()
            self.frozen_with_jobs = 0

    @contextmanager
    def reading(self, active_jobs: Callable[[], int]) -> Iterator[None]:
        """Around a restart's reading of the queue: the collector off, then after_batch."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            yield
        finally:
            self.after_batch(active_jobs())
            if enabled:
                gc.enable()
