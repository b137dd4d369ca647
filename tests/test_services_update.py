"""`gpusched service update`: a rolling restart under continuous traffic loses no request;
a service and its front door outlive a daemon restart."""

from __future__ import annotations

import json

from conftest import wait_until
from services_util import SERVE, Traffic, ask, create, needs_haproxy, needs_torch, show, wait_ready


@needs_haproxy
@needs_torch
def test_a_rolling_update_under_traffic_loses_no_request(home):
    created = create(
        home, "roll", "--replicas", "2", "--health", "/healthz", "--gpus", "1", command=SERVE
    )
    before = wait_ready(home, "roll", 2)
    old_ids = {r["job_id"] for r in before["replicas"]}
    with Traffic(created["listen"], clients=2) as traffic:
        wait_until(lambda: traffic.served() >= 10, "traffic flowing")
        updated = json.loads(
            home.run("service", "update", "roll", "--json", "--", *SERVE, "--layers", "2").stdout
        )
        assert updated["generation"] == 2
        after = wait_ready(home, "roll", 2, timeout=180, generation=2)
        served = traffic.served()
        wait_until(lambda: traffic.served() >= served + 10, "traffic through the new replicas")
    assert not old_ids & {r["job_id"] for r in after["replicas"]}
    assert traffic.served() >= 20 and not traffic.failures(), traffic.failures()[:5]
    # The old replicas were drained, then cancelled by the service, not failed.
    for job_id in old_ids:
        job = home.show(job_id)
        assert job["state"] == "cancelled" and "service roll" in job["end_reason"], job
    events = " ".join(e["event"] for e in show(home, "roll")["events"])
    assert "drained and stopped" in events


@needs_haproxy
def test_a_service_and_its_front_door_outlive_a_daemon_restart(home):
    created = create(home, "keep", "--replicas", "1")
    first = wait_ready(home, "keep", 1)
    home.run("daemon", "stop")
    # Jobs outlive the daemon, and so does the front door: it still answers.
    assert ask(created["listen"], "/")[0] == 200
    home.start()
    again = wait_ready(home, "keep", 1)
    assert again["proxy_pid"] == first["proxy_pid"]
    assert [r["job_id"] for r in again["replicas"]] == [r["job_id"] for r in first["replicas"]]
    home.run("service", "scale", "keep", "2")
    wait_ready(home, "keep", 2)
    assert ask(created["listen"], "/")[0] == 200
