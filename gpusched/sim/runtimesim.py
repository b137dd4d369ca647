"""`simulate --runtimes predicted` and `--forecast`: each job's runtime predicted, at its
submission, from the runs that had ended by then in the replay, as the daemon predicts it
(core/sched/runtimes.py); and each job's start forecast at its submission
(core/sched/forecast.py), set against its real start.

Traces such as Philly's record no job names: a job's key is its tenant and GPU count.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from gpusched.core.models import Job, job_with
from gpusched.core.sched import forecast, runtimes
from gpusched.core.sched.placement import PlacementRules
from gpusched.core.sched.queuerules import QueueRules
from gpusched.sim import traces
from gpusched.sim.simulator import DEFAULT_HALF_LIFE_S, JobResult, _as_jobs, _Replay, results_of

RUNTIMES = ("true", "predicted")
# A forecast is weighed against the jobs that waited at least this long: for a job that
# starts at once, a share of its wait means nothing.
WAITED_S = 60.0


@dataclass(frozen=True)
class ForecastReport:
    jobs: int  # jobs that waited WAITED_S or more: the ones weighed
    median_error_share: float  # median of |forecast - real start| / real wait
    within_interval: float  # share whose real start fell inside the 80 % interval
    unknown: int  # forecast none (a job ahead had neither --time nor a prediction)


def job_key(job: traces.TraceJob) -> str:
    return f"{job.tenant}-{job.num_gpus}gpu"


class _PredictingReplay(_Replay):
    """The replay, each job predicted (and its forecast taken) when it joins the queue."""

    def __init__(
        self,
        trace_jobs: Sequence[traces.TraceJob],
        gpus: int,
        rules: PlacementRules,
        queue: QueueRules,
        predicted: bool,
        with_forecast: bool,
    ):
        super().__init__(_as_jobs(trace_jobs), gpus, rules, queue, DEFAULT_HALF_LIFE_S)
        self.trace_jobs, self.predicted, self.with_forecast = trace_jobs, predicted, with_forecast
        self.durations = {job.id: t.duration_s for job, t in zip(self.jobs, trace_jobs)}
        self.ended: dict[str, list[float]] = {}  # "job:KEY", "user:NAME", "box" -> runtimes
        self.forecasts: dict[int, forecast.Forecast | None] = {}

    def duration_s(self, job: Job) -> float:
        return self.durations[job.id]

    def _runs(self, name: str) -> list[float]:
        """Newest first, as the store reads them."""
        return self.ended.get(name, [])[-runtimes.HISTORY_RUNS :][::-1]

    def enqueue(self, job: Job) -> None:
        trace_job = self.trace_jobs[job.id]
        got = runtimes.predict(
            self._runs(f"job:{job_key(trace_job)}"),
            self._runs(f"user:{trace_job.tenant}"),
            self._runs("box"),
        )
        job = job_with(
            job,
            time_limit_s=None if self.predicted else job.time_limit_s,
            predicted_s=got and got.runtime_s,
            predicted_low_s=got and got.low_s,
            predicted_high_s=got and got.high_s,
        )
        super().enqueue(job)
        if self.with_forecast:
            self.forecasts[job.id] = self._forecast(job)

    def _forecast(self, job: Job) -> forecast.Forecast | None:
        running = list(self.running.values())
        found = forecast.forecasts(
            list(self.waiting.values()),
            running,
            self.current_loads(running),
            self.inventory,
            self.rules,
            self.queue,
            job.submitted_at,
            until_id=job.id,
        )
        return found.get(job.id)

    def finish_until(self, now: float) -> None:
        ended = [job_id for end_s, job_id in self.ends if end_s <= now]
        super().finish_until(now)
        for job_id in ended:
            trace_job = self.trace_jobs[job_id]
            for name in (f"job:{job_key(trace_job)}", f"user:{trace_job.tenant}", "box"):
                self.ended.setdefault(name, []).append(trace_job.duration_s)


def replay(
    trace_jobs: Sequence[traces.TraceJob],
    *,
    gpus: int,
    rules: PlacementRules,
    discipline: str,
    predicted: bool,
    with_forecast: bool,
) -> tuple[list[JobResult], ForecastReport | None]:
    """Every job's result, and with_forecast, how well the forecasts held."""
    run = _PredictingReplay(
        trace_jobs, gpus, rules, QueueRules(discipline=discipline), predicted, with_forecast
    )
    results = results_of(trace_jobs, run.run())
    return results, (weigh(results, run.forecasts) if with_forecast else None)


def weigh(
    results: Sequence[JobResult], found: dict[int, forecast.Forecast | None]
) -> ForecastReport:
    """The forecasts against the real starts, over the jobs that waited WAITED_S or more."""
    errors, inside, unknown = [], 0, 0
    for n, result in enumerate(results):
        if result.wait_s < WAITED_S:
            continue
        got = found.get(n)
        if got is None:
            unknown += 1
            errors.append(math.inf)
            continue
        errors.append(abs(got.start - result.start_s) / result.wait_s)
        high = math.inf if got.high is None else got.high
        inside += got.low - 1.0 <= result.start_s <= high + 1.0  # to the second
    return ForecastReport(
        jobs=len(errors),
        median_error_share=statistics.median(errors) if errors else 0.0,
        within_interval=inside / len(errors) if errors else 0.0,
        unknown=unknown,
    )
