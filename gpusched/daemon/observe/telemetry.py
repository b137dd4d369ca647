"""What the loop counts as it goes, for /metrics: job starts and ends, wait and run times,
GPU reads and their failures, and whether a turn of the loop is under way (stdlib only).

The loop thread writes; the metrics thread (daemon/observe/metrics.py) reads copies taken under
one lock, so a scrape never sees a histogram half updated. Kept whether or not metrics are
served: a few integer additions per job, and /metrics can be turned on by a restart with
nothing else changed.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from gpusched.core.models import FINAL_STATES, Inventory, Job, JobState

# Submit to start: seconds to a day (the research notes' buckets, as Slurm sites see waits).
WAIT_BUCKETS_S = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 28800, 86400)
# Start to end: a minute to a week.
RUN_BUCKETS_S = (60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400, 259200, 604800)
# Every final state, in a fixed order: each is exported, 0 until a job ends in it.
END_STATES = tuple(s.value for s in JobState if s in FINAL_STATES)


@dataclass
class Histogram:
    """Cumulative-ready bucket counts, a sum and a count (Prometheus's histogram)."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; +Inf last
    sum_s: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.sum_s += seconds

    def copy(self) -> Histogram:
        out = Histogram(self.bounds)
        out.counts, out.sum_s = list(self.counts), self.sum_s
        return out

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it) for each bound, then +Inf."""
        total, out = 0, []
        for bound, count in zip([*self.bounds, float("inf")], self.counts):
            total += count
            out.append((float(bound), total))
        return out


@dataclass
class Counts:
    """A copy of the counters, for one scrape."""

    submitted: int = 0
    started: int = 0
    ended: dict[str, int] = field(default_factory=lambda: dict.fromkeys(END_STATES, 0))
    wait: Histogram = field(default_factory=lambda: Histogram(WAIT_BUCKETS_S))
    run: Histogram = field(default_factory=lambda: Histogram(RUN_BUCKETS_S))
    gpu_reads: int = 0
    gpu_read_errors: int = 0
    last_good_read_s: float | None = None  # time() of the last read without a problem
    busy_since_mono: float | None = None  # monotonic() when the turn under way began
    # GPU label -> uuid of every GPU that answered since the start: one that is lost or
    # gone keeps its gpusched_gpu_up series (at 0, under its real uuid).
    known_gpus: dict[str, str] = field(default_factory=dict)


class Telemetry:
    """The loop's counters. Each change is one call from where it happens: a job's
    transition (DaemonState.remember), a GPU read (Daemon.read_gpus), a turn (Daemon.loop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = Counts()

    def job_changed(self, before: Job | None, after: Job) -> None:
        """A job as it was (None: new) and as it is now: count starts and ends."""
        was = before.state if before is not None else None
        if was is after.state:
            return
        with self._lock:
            c = self._counts
            if before is None and after.state is JobState.PENDING:
                c.submitted += 1
            elif after.state is JobState.RUNNING:
                c.started += 1
                # The queue wait is the first start's: a retry's would count its earlier runs.
                if after.started_at is not None and after.attempt == 1:
                    c.wait.observe(max(0.0, after.started_at - after.submitted_at))
            elif after.state.is_final:
                c.ended[after.state.value] += 1
                if was is JobState.RUNNING and after.started_at and after.ended_at:
                    c.run.observe(max(0.0, after.ended_at - after.started_at))

    def jobs_submitted(self, count: int) -> None:
        with self._lock:
            self._counts.submitted += count

    def gpus_read(self, inventory: Inventory, now_s: float) -> None:
        """One read of the GPUs: an error when the backend failed or a GPU did not answer."""
        failed = bool(inventory.problem) or any(not g.is_healthy for g in inventory.gpus)
        with self._lock:
            c = self._counts
            c.gpu_reads += 1
            c.gpu_read_errors += failed
            if not inventory.problem:
                c.last_good_read_s = now_s
            for gpu in inventory.schedulable():
                if gpu.is_healthy and gpu.uuid:
                    c.known_gpus[gpu.label] = gpu.uuid

    @contextmanager
    def turn(self, monotonic: Callable[[], float]) -> Iterator[None]:
        """A turn of the loop: while it lasts, a request waits (the loop lag)."""
        self._counts.busy_since_mono = monotonic()
        try:
            yield
        finally:
            self._counts.busy_since_mono = None

    def copy(self) -> Counts:
        with self._lock:
            c = self._counts
            return Counts(
                c.submitted,
                c.started,
                dict(c.ended),
                c.wait.copy(),
                c.run.copy(),
                c.gpu_reads,
                c.gpu_read_errors,
                c.last_good_read_s,
                c.busy_since_mono,
                dict(c.known_gpus),
            )
