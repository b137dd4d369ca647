"""The services' /metrics families, from the figures the loop swaps in whole at each load
sample (DaemonState.service_figures): a scrape never waits for the loop."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

if TYPE_CHECKING:
    from prometheus_client.core import Metric

LABELS = ["service"]


def service_families(figures: Iterable[dict[str, Any]]) -> list[Metric]:
    figures = list(figures)
    if not figures:  # a daemon without services shows no empty service families
        return []
    wanted = GaugeMetricFamily(
        "gpusched_service_replicas_wanted",
        "Replicas a service wants now (scale, autoscaling).",
        labels=LABELS,
    )
    ready = GaugeMetricFamily(
        "gpusched_service_replicas_ready",
        "Replicas in the front door, passing their health checks.",
        labels=LABELS,
    )
    in_flight = GaugeMetricFamily(
        "gpusched_service_requests_in_flight",
        "Requests the front door is serving or queueing.",
        labels=LABELS,
    )
    requests = CounterMetricFamily(
        "gpusched_service_requests",
        "Requests answered through the front door.",
        labels=LABELS + ["outcome"],
    )
    scaled = CounterMetricFamily(
        "gpusched_service_scale_events",
        "Changes of the replicas wanted, by autoscaling or by hand.",
        labels=LABELS,
    )
    latency = HistogramMetricFamily(
        "gpusched_service_request_duration_seconds",
        "Time from request to answer through the front door.",
        labels=LABELS,
    )
    for f in figures:
        name = [f["name"]]
        wanted.add_metric(name, f["wanted"])
        ready.add_metric(name, f["ready"])
        in_flight.add_metric(name, f["in_flight"])
        requests.add_metric(name + ["ok"], f["requests_total"] - f["failed_total"])
        requests.add_metric(name + ["failed"], f["failed_total"])
        scaled.add_metric(name, f["scale_events_total"])
        cumulative, buckets = 0, []
        for bound_ms, count in zip(f["latency_buckets_ms"], f["latency_counts"]):
            cumulative += count
            buckets.append((repr(bound_ms / 1000), cumulative))
        buckets.append(("+Inf", sum(f["latency_counts"])))
        latency.add_metric(name, buckets, f["latency_sum_ms"] / 1000)
    return [wanted, ready, in_flight, requests, scaled, latency]
