"""The /metrics collector: Prometheus families built from what the daemon already holds.

It runs on prometheus_client's HTTP thread, never the loop's. It reads only what the loop
swaps in whole (the Inventory, pid_jobs, frozen Job objects) or copies in one step (the
active jobs: list(dict.values()) runs without letting the loop in, under the GIL; the
counters, under Telemetry's lock). So a scrape never calls NVML or SQLite and never waits
for the loop. Names follow Prometheus's rules: the gpusched_ prefix, base units, 0-1
ratios, counters ending _total; metrics.py turns off the _created series.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from gpusched import __version__
from gpusched.core.models import GpuInfo, Job, JobState
from gpusched.core.sched import placement
from gpusched.daemon.jobs import idlegpus
from gpusched.daemon.jobs.progress import progress_of
from gpusched.daemon.observe.telemetry import END_STATES, Counts, Histogram
from gpusched.daemon.services.metrics import service_families
from gpusched.daemon.state import DaemonState, Setup

GPU_LABELS = ("gpu", "uuid")
JOB_LABELS = ("job_id", "user")  # never "job": Prometheus's own target label
ACTIVE_STATES = (JobState.PENDING.value, JobState.RUNNING.value)


def _gauge(
    name: str,
    doc: str,
    labels: Iterable[str] = (),
    rows: Iterable[tuple[tuple[str, ...], float]] = (),
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    for values, value in rows:
        family.add_metric(list(values), value)
    return family


def _histogram(name: str, doc: str, hist: Histogram) -> HistogramMetricFamily:
    buckets = [(("+Inf" if b == float("inf") else repr(b)), n) for b, n in hist.cumulative()]
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=hist.sum_s)


class GpuschedCollector:
    """Every gpusched_* family, from one look at the daemon's state per scrape."""

    def __init__(self, state: DaemonState, setup: Setup):
        self.state, self.setup = state, setup

    def collect(self) -> Iterator[Metric]:
        began = time.perf_counter()
        state = self.state
        # The pending jobs as held (their templates answer user, held and submitted_at),
        # copied in one call: this runs on the HTTP server's thread, beside the loop.
        running, counts = state.running(), state.telemetry.copy()
        pending = [job for _, job in list(state.pending_alike())]
        families = [
            *self.gpu_families(running, counts),
            *self.queue_families(running, pending, counts),
            *self.job_families(running),
            *self.health_families(counts),
            *service_families(state.service_figures),
        ]
        families.append(
            _gauge(
                "gpusched_metrics_scrape_duration_seconds",
                "Time this scrape took to gather the daemon's figures.",
                rows=[((), time.perf_counter() - began)],
            )
        )
        return iter(families)

    # -- GPUs -------------------------------------------------------------------------------
    def gpu_families(self, running: list[Job], counts: Counts) -> list[Metric]:
        state, setup = self.state, self.setup
        inventory, pid_jobs = state.inventory, state.pid_jobs
        gpus = inventory.schedulable()
        loads = placement.gpu_loads(
            inventory,
            running,
            pid_jobs,
            setup.rules,
            state.idle_since,
            setup.clock.time(),
            state.outside_peaks,
        )
        healthy = [g for g in gpus if g.is_healthy]

        def per_gpu(
            name: str, doc: str, value: Callable[[GpuInfo], float | None]
        ) -> GaugeMetricFamily:
            rows = [((g.label, g.uuid), v) for g in healthy if (v := value(g)) is not None]
            return _gauge(name, doc, GPU_LABELS, rows)

        driver = inventory.driver_version or ""
        return [
            _gauge(
                "gpusched_gpu_info",
                "A GPU's identity (value 1); join on gpu and uuid.",
                (*GPU_LABELS, "name", "pci_bus_id", "driver_version"),
                [((g.label, g.uuid, g.name, g.bus_id or "", driver), 1.0) for g in healthy],
            ),
            _gauge(
                "gpusched_gpus_detected",
                "GPUs (or MIG devices) the last read found.",
                rows=[((), float(len(gpus)))],
            ),
            _gauge(
                "gpusched_gpu_up",
                "1 if the last read of this GPU worked; 0 once it is "
                "lost or gone (kept at 0 until the daemon restarts).",
                GPU_LABELS,
                _up_rows(gpus, counts.known_gpus),
            ),
            per_gpu(
                "gpusched_gpu_memory_total_bytes",
                "GPU memory in all.",
                lambda g: float(g.mem_total_bytes),
            ),
            per_gpu(
                "gpusched_gpu_memory_used_bytes",
                "GPU memory in use, by any process.",
                lambda g: _float(g.mem_used_bytes),
            ),
            per_gpu(
                "gpusched_gpu_memory_reserved_bytes",
                "GPU memory gpusched promised to "
                "its running jobs that they have not allocated yet.",
                lambda g: float(loads[g.uuid].promised_bytes) if g.uuid in loads else None,
            ),
            per_gpu(
                "gpusched_gpu_memory_outside_bytes",
                "GPU memory held by processes "
                "gpusched did not start, less what [gpus] outside_ignore_below and "
                "outside_idle_after let it ignore.",
                lambda g: float(loads[g.uuid].outside_used_bytes) if g.uuid in loads else None,
            ),
            per_gpu(
                "gpusched_gpu_jobs_running",
                "gpusched jobs running on this GPU.",
                lambda g: float(len(loads[g.uuid].job_ids)) if g.uuid in loads else None,
            ),
            per_gpu(
                "gpusched_gpu_utilization_ratio",
                "Fraction of the last sample period a kernel ran (NVML utilization.gpu / 100).",
                lambda g: None if g.util_pct is None else g.util_pct / 100.0,
            ),
            per_gpu(
                "gpusched_gpu_temperature_celsius",
                "Core temperature.",
                lambda g: _float(g.temperature_c),
            ),
            per_gpu(
                "gpusched_gpu_power_draw_watts", "Power drawn now.", lambda g: _float(g.power_w)
            ),
            per_gpu(
                "gpusched_gpu_power_limit_watts",
                "Enforced power limit.",
                lambda g: _float(g.power_limit_w),
            ),
        ]

    # -- the queue --------------------------------------------------------------------------
    def queue_families(
        self, running: list[Job], pending: list[Job], counts: Counts
    ) -> list[Metric]:
        by_user: dict[str, dict[str, int]] = {}
        for state, jobs in ((JobState.RUNNING.value, running), (JobState.PENDING.value, pending)):
            for job in jobs:
                by_user.setdefault(job.user, dict.fromkeys(ACTIVE_STATES, 0))[state] += 1
        waiting = [job.submitted_at for job in pending if not job.held]
        return [
            _gauge(
                "gpusched_jobs",
                "Jobs in the queue by state (finished ones: gpusched_jobs_ended_total).",
                ("state",),
                [
                    ((JobState.PENDING.value,), len(pending)),
                    ((JobState.RUNNING.value,), len(running)),
                ],
            ),
            _gauge(
                "gpusched_user_jobs",
                "Jobs in the queue by user and state.",
                ("user", "state"),
                [
                    ((user, state), n)
                    for user, row in sorted(by_user.items())
                    for state, n in row.items()
                ],
            ),
            _gauge(
                "gpusched_queue_oldest_pending_submit_timestamp_seconds",
                "Submit time of the oldest pending job not on hold; absent when none.",
                rows=[((), min(waiting))] if waiting else [],
            ),
            _gauge(
                "gpusched_draining",
                "1 while the daemon starts no new jobs (`gpusched drain`).",
                rows=[((), float(self.state.draining))],
            ),
            _counter("gpusched_jobs_submitted_total", "Jobs queued.", counts.submitted),
            _counter(
                "gpusched_jobs_started_total",
                "Job starts (a retried job starts again).",
                counts.started,
            ),
            _counter(
                "gpusched_jobs_ended_total",
                "Jobs that reached a final state, by state.",
                None,
                ("state",),
                [((s,), counts.ended[s]) for s in END_STATES],
            ),
            _histogram(
                "gpusched_job_wait_seconds", "From submit to a job's first start.", counts.wait
            ),
            _histogram(
                "gpusched_job_run_seconds",
                "From start to end of the runs that ended a job (not those a retry followed).",
                counts.run,
            ),
        ]

    # -- running jobs -----------------------------------------------------------------------
    def job_families(self, running: list[Job]) -> list[Metric]:
        state = self.state
        cap = self.setup.settings.metrics_max_job_series
        shown = sorted(running, key=lambda job: job.id)[:cap]
        observed = placement.job_gpu_peaks(state.inventory, state.pid_jobs)
        totals = {g.uuid: g.mem_total_bytes for g in state.inventory.schedulable()}
        labels = {g.uuid: g.label for g in state.inventory.schedulable()}
        rows = [(job, (str(job.id), job.user)) for job in shown]
        progress = [
            (key, report["fraction"])
            for job, key in rows
            if (report := progress_of(job, self.setup.paths)) is not None
        ]
        now = self.setup.clock.time()

        def idle(job_id: int) -> float | None:
            return idlegpus.flagged_since(state, self.setup.settings, job_id, now)

        return [
            _gauge(
                "gpusched_job_gpus",
                "GPUs a running job holds.",
                JOB_LABELS,
                [(key, len(job.gpu_uuids)) for job, key in rows],
            ),
            _gauge(
                "gpusched_job_gpu_assignment",
                "1 for each GPU a running job holds: the join from jobs to GPU series.",
                (*JOB_LABELS, *GPU_LABELS),
                [((*key, labels.get(u, ""), u), 1.0) for job, key in rows for u in job.gpu_uuids],
            ),
            _gauge(
                "gpusched_job_gpu_memory_requested_bytes",
                "GPU memory a running job asked for on each of its GPUs (a whole GPU: its total).",
                JOB_LABELS,
                [(key, float(_requested(job, totals))) for job, key in rows if job.gpu_uuids],
            ),
            _gauge(
                "gpusched_job_gpu_memory_used_bytes",
                "GPU memory a running job's processes hold now on the busiest of its GPUs.",
                JOB_LABELS,
                [(key, float(observed.get(job.id, 0))) for job, key in rows if job.gpu_uuids],
            ),
            _gauge(
                "gpusched_job_progress_ratio",
                "A running job's last gpusched.job.progress() "
                "report (0-1); absent until it reports.",
                JOB_LABELS,
                progress,
            ),
            _gauge(
                "gpusched_job_start_timestamp_seconds",
                "When a running job started.",
                JOB_LABELS,
                [(key, job.started_at or 0.0) for job, key in rows],
            ),
            _gauge(
                "gpusched_job_gpu_idle_seconds",
                "How long all of a running job's GPUs "
                "have been 0% busy, once past [idle] after; absent otherwise.",
                JOB_LABELS,
                [(key, now - since) for job, key in rows if (since := idle(job.id))],
            ),
            _gauge(
                "gpusched_jobs_gpu_idle",
                "Running jobs whose GPUs have all been 0% busy longer than [idle] after.",
                rows=[((), float(sum(1 for job in running if idle(job.id))))],
            ),
            _gauge(
                "gpusched_jobs_gpu_mem_over",
                "Running jobs that used more GPU memory than their --gpu-mem plus "
                "[memory] gpu_over_margin_pct on a shared GPU.",
                rows=[((), float(sum(1 for job in running if job.gpu_mem_over_by)))],
            ),
            _gauge(
                "gpusched_metrics_job_series_dropped",
                "Running jobs left without per-job series by metrics.max_job_series.",
                rows=[((), float(len(running) - len(shown)))],
            ),
        ]

    # -- the daemon itself ------------------------------------------------------------------
    def health_families(self, counts: Counts) -> list[Metric]:
        state, clock = self.state, self.setup.clock
        busy = counts.busy_since_mono
        last_read = counts.last_good_read_s
        return [
            _gauge(
                "gpusched_build_info",
                "The daemon's version and GPU backend (value 1).",
                ("version", "backend"),
                [((__version__, state.inventory.backend), 1.0)],
            ),
            _gauge(
                "gpusched_daemon_start_timestamp_seconds",
                "When the daemon started.",
                rows=[((), self.setup.started_at)],
            ),
            _gauge(
                "gpusched_loop_lag_seconds",
                "How long the loop has been busy with its "
                "current turn: a request now waits at least this long (0 when idle).",
                rows=[((), 0.0 if busy is None else max(0.0, clock.monotonic() - busy))],
            ),
            _gauge(
                "gpusched_nvml_up",
                "1 if the last read of the GPUs worked (NVML, or the "
                "simulated backend), 0 if it failed.",
                rows=[((), float(not state.inventory.problem))],
            ),
            _counter("gpusched_nvml_reads_total", "Reads of the GPUs.", counts.gpu_reads),
            _counter(
                "gpusched_nvml_read_errors_total",
                "Reads of the GPUs that failed or found a GPU that did not answer.",
                counts.gpu_read_errors,
            ),
            _gauge(
                "gpusched_nvml_last_read_timestamp_seconds",
                "When the GPUs were last read without a failure; absent until then.",
                rows=[((), last_read)] if last_read is not None else [],
            ),
            _gauge(
                "gpusched_store_writes_failing",
                "1 while writes to the job queue fail (a full disk, say): nothing new starts.",
                rows=[((), float(state.writes.failing))],
            ),
        ]


def _up_rows(
    gpus: tuple[GpuInfo, ...], known: dict[str, str]
) -> list[tuple[tuple[str, str], float]]:
    """gpusched_gpu_up: each GPU read, then each GPU seen before and gone since, at 0;
    a GPU that stopped answering under the uuid it had when it last answered."""
    present = {gpu.label for gpu in gpus}
    rows = [
        ((g.label, g.uuid if g.is_healthy else known.get(g.label, g.uuid)), float(g.is_healthy))
        for g in gpus
    ]
    return rows + [
        ((label, uuid), 0.0) for label, uuid in sorted(known.items()) if label not in present
    ]


def _counter(
    name: str,
    doc: str,
    value: float | None,
    labels: Iterable[str] = (),
    rows: Iterable[tuple[tuple[str, ...], float]] = (),
) -> CounterMetricFamily:
    """A counter (name given with _total, as it is exposed)."""
    family = CounterMetricFamily(name, doc, value=value, labels=list(labels) or None)
    for values, n in rows:
        family.add_metric(list(values), n)
    return family


def _float(value: float | int | None) -> float | None:
    return None if value is None else float(value)


def _requested(job: Job, totals: dict[str, int]) -> int:
    if job.request.gpu_mem_bytes is not None:
        return job.request.gpu_mem_bytes
    return max((totals.get(uuid, 0) for uuid in job.gpu_uuids), default=0)
