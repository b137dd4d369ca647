"""What a service shows: requests, latency histogram, replicas wanted vs ready and scale
events, in `gpusched service show`, `service ls` and the metrics endpoint."""

from __future__ import annotations

import socket

from conftest import wait_until
from metrics_scrape import metrics_url, scrape
from services_util import create, needs_haproxy, show, wait_ready, who_answers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@needs_haproxy
def test_requests_latency_and_scale_events_in_show_ls_and_metrics(home):
    home.write_config(f'[metrics]\nlisten = "127.0.0.1:{free_port()}"\n')
    created = create(home, "obs", "--replicas", "1")
    wait_ready(home, "obs", 1)
    assert sum(who_answers(created["listen"], 12).values()) == 12
    shown = wait_until(
        lambda: (s := show(home, "obs"))["requests_total"] >= 12 and s,
        "the front door's request log to count 12 requests",
    )
    assert shown["failed_total"] == 0 and sum(shown["latency_counts"]) >= 12
    assert shown["p95_ms"] is not None and shown["requests_per_s"] > 0
    home.run("service", "scale", "obs", "2")
    wait_ready(home, "obs", 2)
    text = home.run("service", "show", "obs").stdout
    assert "2 ready of 2 wanted" in text and "scaled to 2 replica(s)" in text
    assert "(0 failed)" in text
    # `gpusched top` has a line for the services (once their figures are sampled).
    wait_until(
        lambda: "Services: obs 2/2 ready" in home.run("top", "--once").stdout,
        "top to show the service",
    )
    table = home.run("service", "ls").stdout.splitlines()
    assert table[0].split()[:3] == ["NAME", "USER", "REPLICAS"] and "2/2" in table[1]

    def scraped():
        got = scrape(metrics_url(home))
        ok = got.value("gpusched_service_requests_total", service="obs", outcome="ok")
        ready = got.value("gpusched_service_replicas_ready", service="obs")
        return got if ok and ok >= 12 and ready == 2 else None

    got = wait_until(scraped, "/metrics to show the service")
    assert got.value("gpusched_service_replicas_wanted", service="obs") == 2
    assert got.value("gpusched_service_scale_events_total", service="obs") == 1
    assert got.value("gpusched_service_request_duration_seconds_count", service="obs") >= 12
    # Names and labels are what dashboards query: frozen like the rest (test_metrics.py).
    assert {k: v for k, v in got.shape().items() if k.startswith("gpusched_service_")} == {
        "gpusched_service_replicas_wanted": ("gauge", ("service",)),
        "gpusched_service_replicas_ready": ("gauge", ("service",)),
        "gpusched_service_requests_in_flight": ("gauge", ("service",)),
        "gpusched_service_requests_total": ("counter", ("outcome", "service")),
        "gpusched_service_scale_events_total": ("counter", ("service",)),
        "gpusched_service_request_duration_seconds": ("histogram", ("service",)),
    }
